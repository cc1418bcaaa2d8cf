# Shared option parser of every egs/*/run.sh. Source it after setting the defaults:
#   stage=1; stop_stage=5; exp=exp/campplus
#   . ../tools/parse_options.sh
# `--name value` and `--name=value` set the shell variable `name` (dashes become underscores),
# which must already have a default: an unknown option is an error. `--help` prints $help_message
# (if the script set one) and every option with its current value. Positional arguments are left
# in "$@".
_po_names=()
for _po_v in $(compgen -v); do
  case "$_po_v" in [a-z]*) _po_names+=("$_po_v") ;; esac
done
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h)
      [ -n "${help_message:-}" ] && echo "$help_message"
      echo "Options (current values):"
      for _po_v in "${_po_names[@]}"; do
        case "$_po_v" in _*|help_message) ;; *) printf '  --%s %q\n' "$_po_v" "${!_po_v}" ;; esac
      done
      exit 0 ;;
    --*=*) _po_name="${1%%=*}"; _po_value="${1#*=}"; shift ;;
    --*)
      [ $# -ge 2 ] || { echo "error: option $1 needs a value" >&2; exit 1; }
      _po_name="$1"; _po_value="$2"; shift 2 ;;
    *) break ;;
  esac
  _po_var="${_po_name#--}"; _po_var="${_po_var//-/_}"
  _po_known=0
  for _po_v in "${_po_names[@]}"; do [ "$_po_v" = "$_po_var" ] && _po_known=1; done
  if [ "$_po_known" != 1 ] || [[ "$_po_var" == _* ]]; then
    echo "error: unknown option $_po_name (see --help)" >&2; exit 1
  fi
  printf -v "$_po_var" '%s' "$_po_value"
done
unset _po_names _po_v _po_name _po_value _po_var _po_known
