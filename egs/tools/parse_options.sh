# Shared option parser of every egs/*/run.sh; source it after the recipe's `opt NAME DEFAULT` lines
# (egs/tools/common.sh). `--name value` and `--name=value` set the declared option `name` (dashes
# become underscores); anything else starting with `--` is an error, and so is an environment
# variable that was not declared (http_proxy is not an option). `--help` prints $help_message and
# every option with its current value. A recipe takes no other argument: a word that is not an option (`stage 2`,
# `-stage 2`, a value given twice) is an error, never left unread while every stage runs. Afterwards an option
# declared with a rule (`opt NAME DEFAULT RULE`: choices, a named rule, true/false for a boolean default) must
# keep it, and --stage and --stop_stage must be stage numbers 1..$LAST_STAGE with stage <= stop_stage. Every refusal is one
# `error: ...` line on stderr and exit code 2 (bad input, as the speakerlab-* commands).
_po_declared() { local v; for v in "${_options[@]}"; do [ "$v" = "$1" ] && return 0; done; return 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h)
      [ -n "${help_message:-}" ] && echo "$help_message"
      echo "Options (current values):"
      for _po_v in "${_options[@]}"; do printf '  --%s %q\n' "$_po_v" "${!_po_v}"; done
      exit 0 ;;
    --*=*) _po_name="${1%%=*}"; _po_value="${1#*=}"; shift ;;
    --*)
      [ $# -ge 2 ] || { echo "error: option $1 needs a value" >&2; exit 2; }
      _po_name="$1"; _po_value="$2"; shift 2 ;;
    *)
      echo "error: unexpected argument '$1': recipe options are --name value or --name=value (see --help)" >&2
      exit 2 ;;
  esac
  _po_var="${_po_name#--}"; _po_var="${_po_var//-/_}"
  if ! _po_declared "$_po_var"; then
    echo "error: unknown option $_po_name (see --help)" >&2; exit 2
  fi
  printf -v "$_po_var" '%s' "$_po_value"
done
for _po_v in "${!_option_rules[@]}"; do
  if ! [[ "${!_po_v}" =~ ${_option_rules[$_po_v]} ]]; then
    echo "error: --$_po_v must be ${_option_rule_texts[$_po_v]}, got '${!_po_v}'" >&2; exit 2
  fi
done
for _po_v in stage stop_stage; do
  if ! [[ "${!_po_v}" =~ ^[0-9]+$ ]] || [ "${!_po_v}" -lt 1 ] || [ "${!_po_v}" -gt "$LAST_STAGE" ]; then
    echo "error: --$_po_v must be a stage number from 1 to $LAST_STAGE, got '${!_po_v}'" >&2; exit 2
  fi
done
if [ "$stage" -gt "$stop_stage" ]; then
  echo "error: --stage $stage is after --stop_stage $stop_stage: nothing would run" >&2; exit 2
fi
unset -f _po_declared
unset _po_v _po_name _po_value _po_var
