#!/usr/bin/env bash
# Fails when a commit subject is longer than 72 characters. Checks the commits since the
# last tag or the last 50, whichever are fewer, in the git checkout DIR (default: the
# current directory); prints each offending subject with its hash and length.
#
#   scripts/check-commits.sh [DIR]
#
# .ci/run runs it first, before the set-up. What it leaves out, and why:
# - merge commits: git writes their subjects, and the one CI checks out for a pull request
#   ("Merge <40 hex> into <40 hex>") is 92 characters;
# - the commits up to BASELINE and its ancestors: they were committed before the check and
#   one of them is over the limit (751cd3b, 82 characters); without it CI would fail until
#   that commit left the last 50. To let a long subject that reached main pass, move
#   BASELINE to it (history is not rewritten here). $CHECK_COMMITS_BASELINE overrides it.
# A shallow clone (CI's usual checkout) holds only the latest commits: those it holds are
# checked. A baseline or tag outside it is not there to stop at, and then every commit the
# clone holds came after it (history here is linear).
set -uo pipefail

case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
esac

LIMIT=72
MOST=50
BASELINE="${CHECK_COMMITS_BASELINE-751cd3b8d18bf4111ed29a752c944bd50ffcda51}"

dir="${1:-.}"
# Subjects are counted in characters, not bytes, where the UTF-8 locale exists.
export LC_ALL=C.UTF-8 2>/dev/null
git() { command git -C "$dir" "$@"; }

if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  echo "check-commits: $dir is not a git checkout with commits: subjects not checked"
  exit 0
fi
stop=()
scope="the last $MOST"
if tag="$(git describe --tags --abbrev=0 HEAD 2>/dev/null)"; then
  stop+=("^$tag")
  scope="since the tag $tag, at most $MOST"
fi
if [[ -n "$BASELINE" ]] && git cat-file -e "$BASELINE^{commit}" 2>/dev/null; then
  stop+=("^$BASELINE")
  scope="$scope, after the baseline ${BASELINE:0:7}"
fi

if ! commits="$(git log --no-merges --format='%h %s' -n "$MOST" HEAD ${stop[@]+"${stop[@]}"})"; then
  echo "check-commits: git log failed in $dir" >&2
  exit 2
fi
checked=0
long=0
while IFS= read -r line; do
  [[ -n "$line" ]] || continue
  checked=$((checked + 1))
  hash="${line%% *}"
  subject="${line#* }"
  if ((${#subject} > LIMIT)); then
    long=$((long + 1))
    echo "check-commits: $hash: subject of ${#subject} characters (at most $LIMIT): $subject"
  fi
done <<<"$commits"

if ((long)); then
  echo "check-commits: $long of $checked commit subject(s) ($scope) over $LIMIT characters:" \
    "shorten them (git commit --amend, git rebase -i) before they reach main"
  exit 1
fi
echo "check-commits: $checked commit subject(s) ($scope), none over $LIMIT characters"
