#!/usr/bin/env bash
# Idempotent set-up: a virtual environment with a tested stack and sparktf (editable),
# compiled to bytecode once (processes then import TensorFlow from .pyc files), the
# Hadoop jars of the local HDFS (cached under .local/hadoop/lib; Maven's own cache is ~/.m2)
# and Hadoop's S3A connector at pyspark's Hadoop version (.local/hadoop/s3a-VERSION).
#   scripts/setup.sh [--stack default|petastorm] [--gpu] [--no-hadoop]
#   --stack default (.venv, requirements.lock): the current Spark line, pyarrow and numpy 2;
#   --stack petastorm (.venv-petastorm, requirements-petastorm.lock): Spark 4.0 and petastorm.
#   --no-hadoop: the Python environment only (no Java, no Maven): what the unit tests need.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
# test: pytest and the linters; connect: the Spark Connect client (both stacks)
EXTRAS="test,connect"
HADOOP=1
STACK=default
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --stack) [ $# -ge 2 ] || { echo "setup.sh: --stack needs a value (default, petastorm)" >&2; exit 2; }
             STACK="$2"; shift ;;
    --stack=*) STACK="${1#--stack=}" ;;
    --gpu) EXTRAS="$EXTRAS,gpu" ;;
    --no-hadoop) HADOOP=0 ;;
    *) echo "setup.sh: unknown option $1 (--stack, --gpu, --no-hadoop, --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$STACK" in
  default) VENV=.venv LOCK=requirements.lock ;;
  petastorm) VENV=.venv-petastorm LOCK=requirements-petastorm.lock EXTRAS="$EXTRAS,petastorm" ;;
  *) echo "setup.sh: unknown stack '$STACK' (default, petastorm)" >&2; exit 2 ;;
esac

fail() { echo "setup.sh: $*" >&2; exit 1; }
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || fail "Python 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11"
if [ "$HADOOP" = 1 ]; then
  command -v java >/dev/null || fail "java not found: install a Java 17 JDK (e.g. apt-get install openjdk-17-jdk-headless)"
  jv=$(java -version 2>&1 | awk -F'"' '/version/{print $2}' | cut -d. -f1)
  [ "${jv:-0}" -ge 17 ] || fail "Java 17 or newer is required for Spark 4 (found $jv)"
  command -v mvn >/dev/null || fail "mvn not found: install Maven (e.g. apt-get install maven); it fetches the Hadoop jars"
fi

stamp="$VENV/.sparktf-installed"
UV_VERSION=0.13.9
UV=.local/uv/bin/uv
uv_ok() { case "$("$UV" --version 2>/dev/null)" in "uv $UV_VERSION"|"uv $UV_VERSION "*) ;; *) return 1 ;; esac; }
want="$(cat pyproject.toml "$LOCK" | sha256sum | cut -c1-16)-$EXTRAS-pyc"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup.sh: creating $VENV ($STACK stack)"
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup.sh: installing the $STACK stack ($LOCK) into $VENV (a minute or two the first time)"
  # uv installs the same pins as pip does, in about half the time (its own wheel, kept in
  # .local/uv, outside every venv so that --ship-env never packs it); pip where uv cannot be had.
  if ! uv_ok; then
    rm -rf .local/uv.new
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --target .local/uv.new \
        "uv==$UV_VERSION" && rm -rf .local/uv && mv .local/uv.new .local/uv
  fi
  if uv_ok; then
    "$UV" pip install -q --python "$VENV/bin/python" -c "$LOCK" -e ".[$EXTRAS]"
  else
    echo "setup.sh: uv $UV_VERSION could not be installed; installing with pip"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$LOCK" -e ".[$EXTRAS]"
  fi
  # Every installed module compiled to bytecode now (uv does not; --compile-bytecode would
  # compile only what it installs): where PYTHONDONTWRITEBYTECODE is set (a CI runner, a
  # container) nothing else ever writes a .pyc, and every process compiled TensorFlow's and
  # Keras's sources again when it imported them: 19-22 s for `import tensorflow` on 2 cores
  # instead of 3-7. About 40 s once (files that do not compile, e.g. templates, are skipped).
  echo "setup.sh: compiling $VENV's modules to bytecode"
  "$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
else
  echo "setup.sh: $VENV is up to date ($STACK stack)"
fi

JARS=".local/hadoop/lib"
if [ "$HADOOP" = 0 ]; then
  echo "setup.sh: done (no Hadoop jars: --no-hadoop). Python: $ROOT/$VENV/bin/python"
  exit 0
fi
# fetch_jars DIR POM JAR WHAT [MVN-ARGS...]: POM's runtime dependencies into DIR. They are
# fetched again whenever POM changes (its hash is kept beside them) or DIR has no JAR (a glob),
# into a fresh folder that then replaces the old one, so no jar of an older pom stays behind.
fetch_jars() {
  local dir="$1" pom="$2" jar="$3" what="$4" want
  shift 4
  want="$(sha256sum "$pom" | cut -c1-16)"
  if [ "$(cat "$dir/.pom-sha256" 2>/dev/null)" = "$want" ] && compgen -G "$dir/$jar" >/dev/null; then
    echo "setup.sh: $what present in $dir"
    return 0
  fi
  echo "setup.sh: fetching $what from Maven Central"
  rm -rf "$dir.new"; mkdir -p "$dir.new"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime "$@" \
      -DoutputDirectory="$ROOT/$dir.new" || fail "mvn could not fetch $what (see above)"
  rm -rf "$(dirname "$pom")/target"
  echo "$want" > "$dir.new/.pom-sha256"
  rm -rf "$dir.old"
  if [ -d "$dir" ]; then mv "$dir" "$dir.old"; fi
  mv "$dir.new" "$dir"
  rm -rf "$dir.old"
}
fetch_jars "$JARS" scripts/hdfs/pom.xml "hadoop-minicluster-*.jar" "the Hadoop jars of the local HDFS"
# Hadoop's S3A connector for Spark's s3a:// paths (sparktf.spark.s3a), at the Hadoop version of
# the stack's pyspark, with the AWS SDK modules it needs (scripts/s3a/pom.xml): one folder per
# Hadoop version.
HADOOP_VERSION="$("$VENV/bin/python" -c 'import glob, os, pyspark
jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
print(os.path.basename(jars[0])[len("hadoop-client-api-"):-len(".jar")] if jars else "")')"
[ -n "$HADOOP_VERSION" ] || fail "no hadoop-client-api jar in $VENV's pyspark: cannot tell its Hadoop version"
fetch_jars ".local/hadoop/s3a-$HADOOP_VERSION" scripts/s3a/pom.xml "hadoop-aws-*.jar" \
  "Hadoop's S3A connector ($HADOOP_VERSION)" -Dhadoop.version="$HADOOP_VERSION"
echo "setup.sh: done. Python: $ROOT/$VENV/bin/python"
