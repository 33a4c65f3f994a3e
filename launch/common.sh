# shellcheck shell=bash
# Helpers sourced by the launch scripts: errors, shell quoting, and running (or, with --dry-run, printing)
# commands. Not executable on its own.

DRY_RUN="${HOURGLASS_DRY_RUN:-0}"

die() {
  echo "error: $*" >&2
  exit 2
}

# Quotes one word for a POSIX shell, leaving plain words (flags, paths, gs:// URLs) readable.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+~-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# All arguments quoted and joined by spaces: one copy-pasteable command line.
join_quoted() {
  local word out=""
  for word in "$@"; do
    out+="${out:+ }$(quote "$word")"
  done
  printf '%s' "$out"
}

# Runs a command, or prints it (one line, quoted) under --dry-run.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    join_quoted "$@"
    echo
  else
    echo "+ $(join_quoted "$@")" >&2
    "$@"
  fi
}

# require VALUE "--flag / ENV_VAR" "what it is, e.g. ...": stops with a message naming the setting when empty.
require() {
  [[ -n "$1" ]] || die "missing $2: $3"
}

# Stops on an argument no case of the caller's parser matched.
unknown_argument() {
  if [[ "$1" == --* && "$1" != *=* ]]; then
    die "unknown flag $1 (flags with a value take the form --name=VALUE; see --help)"
  fi
  die "unknown argument $1 (see --help)"
}
