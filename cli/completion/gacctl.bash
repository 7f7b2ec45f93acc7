# bash completion of gacctl: commands, flags, flag values, files (backtest), and run ids asked
# from gacd (with the --address, token and TLS flags already on the line, or
# GAC_ADDRESS / GAC_TOKEN). `cmake --install` puts it where bash-completion
# finds it (share/bash-completion/completions/gacctl); or source it.
# tests/cli checks that every command's flags here are those of its --help.

_gacctl_global_flags="--address --token --token-file --tls --tls-ca --tls-server-name --timeout --help -h"

# The flags of a command ("config set").
_gacctl_command_flags() {
  case "$1" in
    runs) echo "--format" ;;
    show) echo "--window" ;;
    health) echo "--service" ;;
    steps) echo "--start-step --end-step --from --to --rank --layers --scalars --page-size --format" ;;
    tail) echo "--lines -n --follow -f --rank --interval --format" ;;
    "config get") echo "" ;;
    "config set") echo "--c-low --c-high --window-c-low --window-c-high --alpha-mode --mode --trigger --window-steps --reason --expected-version --max-grad-norm --spike-sigma --spike-window --spike-warmup --spike-off" ;;
    "config history") echo "--format" ;;
    calibrate) echo "--window --windowed --apply --apply-to --to --alpha-mode --mode --trigger --window-steps --reason --expected-version" ;;
    replay) echo "--c-low --c-high --alpha-mode --grid --start-step --end-step --from --to --steps --max-diffs --format" ;;
    backtest) echo "--c-high --window-c-low --calibrate-on --window --for-steps --warmup --per-run --format --max-grad-norm --spike-sigma --spike-window --spike-warmup" ;;
  esac
}

# Run ids from gacd; nothing (quietly) when it cannot be asked.
_gacctl_runs() {
  local -a conn=()
  local i w
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    case "$w" in
      --address | --token | --token-file | --tls-ca | --tls-server-name)
        conn+=("$w" "${COMP_WORDS[i + 1]}")
        ((i++))
        ;;
      --address=* | --token=* | --token-file=* | --tls-ca=* | --tls-server-name=* | --tls) conn+=("$w") ;;
    esac
  done
  "${COMP_WORDS[0]}" runs --format csv --timeout 2s "${conn[@]}" 2>/dev/null | tail -n +2 | cut -d, -f1
}

_gacctl() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  local prev=${COMP_WORDS[COMP_CWORD - 1]}
  local cmd="" sub="" i w
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    case "$w" in
      --address | --token | --token-file | --tls-ca | --tls-server-name | --timeout | --format | --from | --to | \
        --start-step | --end-step | --page-size | --apply-to | \
        --rank | --scalars | --lines | -n | --interval | --window | --service | --c-low | --c-high | --alpha-mode | \
        --mode | --reason | --expected-version | --max-diffs | --window-c-low | --window-c-high | --calibrate-on | \
        --for-steps | --warmup | --trigger | --window-steps | --max-grad-norm | --spike-sigma | --spike-window | \
        --spike-warmup)
        ((i++))
        continue
        ;;
      -*) continue ;;
    esac
    if [[ -z $cmd ]]; then
      cmd=$w
    elif [[ $cmd == config && -z $sub ]]; then
      sub=$w
    fi
  done

  case "$prev" in
    --format) COMPREPLY=($(compgen -W "table csv jsonl" -- "$cur")); return ;;
    --mode) COMPREPLY=($(compgen -W "monitor local remote" -- "$cur")); return ;;
    --alpha-mode) COMPREPLY=($(compgen -W "paper exact" -- "$cur")); return ;;
    --trigger) COMPREPLY=($(compgen -W "per_step window" -- "$cur")); return ;;
    --token-file | --tls-ca | --calibrate-on) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --apply-to | --to)
      [[ $cmd == calibrate ]] && COMPREPLY=($(compgen -W "$(_gacctl_runs)" -- "$cur"))
      return
      ;;
    --address | --token | --tls-server-name | --timeout | --from | --start-step | --end-step | --page-size | \
      --rank | --scalars | --lines | -n | \
      --interval | --window | --service | --c-low | --c-high | --reason | --expected-version | --max-diffs | \
      --window-c-low | --window-c-high | --for-steps | --warmup | --window-steps | --max-grad-norm | --spike-sigma | \
      --spike-window | --spike-warmup)
      return
      ;;
  esac

  if [[ -z $cmd ]]; then
    if [[ $cur == -* ]]; then
      COMPREPLY=($(compgen -W "$_gacctl_global_flags --version" -- "$cur"))
    else
      COMPREPLY=($(compgen -W "runs show steps tail config calibrate replay backtest health help" -- "$cur"))
    fi
    return
  fi
  if [[ $cmd == config && -z $sub ]]; then
    COMPREPLY=($(compgen -W "get set history" -- "$cur"))
    return
  fi
  if [[ $cmd == help ]]; then
    COMPREPLY=($(compgen -W "runs show steps tail config calibrate replay backtest health" -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_gacctl_command_flags "$cmd${sub:+ $sub}") $_gacctl_global_flags" -- "$cur"))
    return
  fi
  case "$cmd" in
    show | steps | tail | config | calibrate | replay) COMPREPLY=($(compgen -W "$(_gacctl_runs)" -- "$cur")) ;;
    backtest) COMPREPLY=($(compgen -f -- "$cur")) ;;
  esac
}

complete -F _gacctl gacctl
