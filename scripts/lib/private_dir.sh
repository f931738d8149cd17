# Sourced by scripts/hdfs.sh and scripts/yarn.sh. Their state directory holds what they trust:
# the pid file whose process `stop` kills, ready.env, which they source or print for the user to
# eval, and the record of what `stop` removes. So it must be a directory only its user can
# write to.

# private_dir SCRIPT DIR: creates DIR (mode 700) when it is missing, tightens to 700 a
# directory of the user's own that no one else can write to, and refuses any other (a
# symbolic link, another user's, one a group or others can write to: someone could have
# planted its files): exits 1 naming what is wrong and what to do.
private_dir() {
  local script="$1" dir="$2" owner mode
  (umask 077; mkdir -p -- "$dir")
  if [ -L "$dir" ] || [ ! -d "$dir" ]; then
    echo "$script: $dir is a symbolic link or not a directory: give a --dir of your own" >&2
    exit 1
  fi
  read -r owner mode < <(stat -c '%u %a' -- "$dir")
  if [ "$owner" != "$(id -u)" ]; then
    echo "$script: $dir belongs to uid $owner, not to you (uid $(id -u)): its ready.env and" \
      "pid file could be anyone's; give a --dir of your own" >&2
    exit 1
  fi
  if (( 8#$mode & 8#022 )); then
    echo "$script: $dir is writable by others (mode $mode), so its ready.env and pid file" \
      "could have been planted: check them, then chmod 700 $dir, or give another --dir" >&2
    exit 1
  fi
  if (( 8#$mode & 8#077 )); then chmod 700 -- "$dir"; fi
}
