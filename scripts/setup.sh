#!/usr/bin/env bash
# Idempotent set-up: .venv with the pinned stack and sparktf (editable), and the Hadoop jars
# of the local HDFS (cached under .local/hadoop/lib; Maven's own cache is ~/.m2).
#   scripts/setup.sh [--gpu] [--no-hadoop]
#   --no-hadoop: the Python environment only (no Java, no Maven): what the unit tests need.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
EXTRAS="test"
HADOOP=1
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --gpu) EXTRAS="test,gpu" ;;
    --no-hadoop) HADOOP=0 ;;
    *) echo "setup.sh: unknown option $arg (--gpu, --no-hadoop, --help)" >&2; exit 2 ;;
  esac
done

fail() { echo "setup.sh: $*" >&2; exit 1; }
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || fail "Python 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11"
if [ "$HADOOP" = 1 ]; then
  command -v java >/dev/null || fail "java not found: install a Java 17 JDK (e.g. apt-get install openjdk-17-jdk-headless)"
  jv=$(java -version 2>&1 | awk -F'"' '/version/{print $2}' | cut -d. -f1)
  [ "${jv:-0}" -ge 17 ] || fail "Java 17 or newer is required for Spark 4 (found $jv)"
  command -v mvn >/dev/null || fail "mvn not found: install Maven (e.g. apt-get install maven); it fetches the Hadoop jars"
fi

stamp=".venv/.sparktf-installed"
want="$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)-$EXTRAS"
if [ ! -x .venv/bin/python ]; then
  echo "setup.sh: creating .venv"
  "$PY" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup.sh: installing the pinned stack into .venv (a few minutes the first time)"
  .venv/bin/python -m pip install -q --disable-pip-version-check "pip<25"
  .venv/bin/python -m pip install -q --disable-pip-version-check -c requirements.lock -e ".[$EXTRAS]"
  echo "$want" > "$stamp"
else
  echo "setup.sh: .venv is up to date"
fi

JARS=".local/hadoop/lib"
if [ "$HADOOP" = 0 ]; then
  echo "setup.sh: done (no Hadoop jars: --no-hadoop). Python: $ROOT/.venv/bin/python"
  exit 0
fi
if ! ls "$JARS"/hadoop-minicluster-*.jar >/dev/null 2>&1; then
  echo "setup.sh: fetching the Hadoop jars of the local HDFS from Maven Central"
  mkdir -p "$JARS"
  mvn -q -B -f scripts/hdfs/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$ROOT/$JARS" || fail "mvn could not fetch the Hadoop jars (see above)"
  rm -rf scripts/hdfs/target
else
  echo "setup.sh: Hadoop jars present in $JARS"
fi
echo "setup.sh: done. Python: $ROOT/.venv/bin/python"
