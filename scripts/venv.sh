# Python environments that outlive the checkout (sourced by scripts/setup.sh,
# wheel.sh, wheel_check.sh, trainers_check.sh and cuda12.sh).
#
# CI runs scripts/test.sh on a fresh clone every time; an environment made
# inside the checkout would be made again on every run (minutes each: torch's
# wheels). gac_venv keeps each one in a cache outside the checkout, keyed by
# what it is made from, and points a symbolic link in the checkout at it:
#
#   gac_venv [OPTIONS] LINK REQUIREMENTS...
#     LINK            the path the scripts use (.venv, .venv-py312-torch211,
#                     build/wheel-env/cp312, .cuda12/site, ...)
#     REQUIREMENTS    one or more files given to pip install -r
#     --python P      the interpreter (required): X.Y (the first
#                     ~/.pyenv/versions/X.Y.*/bin/pythonX.Y, else pythonX.Y
#                     on the PATH), or a path or command name
#     --label L       the prefix of its messages (default: venv)
#     --name N        the cache entry's name (default: LINK's last part
#                     without its leading dots)
#     --pip-arg A     one more argument to pip install (repeatable)
#     --env VAR=VAL   pip install runs with it (repeatable; e.g. DS_BUILD_OPS=0)
#     --share PY      the environment also sees PY's packages (a .pth file,
#                     gac_venv_share below)
#     --target        no venv: pip install --target LINK with the interpreter's pip
#     --check         pip check after the install
#     --progress      pip's Collecting / Successfully installed / ERROR lines
#                     as progress (the whole output still goes to the log)
#     --quiet         no message when it is reused
#     --hold          keep the cache entry's lock after returning, until
#                     gac_venv_release (for a caller that installs into it)
#
# The key is the sha256 of the interpreter (its real path and full version
# string: a venv is bound to both), the requirements files' contents, the
# extra pip arguments and variables, --share's site-packages (its real path,
# which the .pth file names, and its gac-requirements.txt) and --target. The
# environment lives in
#   $GAC_VENV_CACHE (default ~/.cache/gac/venvs)/NAME-<first 16 hex of the key>
# and is made only when it is missing or incomplete: .gac-venv-key (what the
# key is made of) is written last, after pip succeeded, and an entry without
# it is removed and made again. An exclusive flock on NAME-<key>.lock next to
# it is held while it is checked and made, so that two runs at once do not
# make it twice or use it half made. Nothing removes old entries: delete the
# folder to reclaim the space (a later run makes what it needs again).
# What is written into an environment after it is made is seen by every
# checkout that uses it: wheel_check.sh installs its wheel into each of its
# environments while holding the lock (--hold); scripts/python_path.sh's
# gac.pth in .venv names the last build that wrote it (the tests put their
# own build first on PYTHONPATH).
#
# LINK becomes a symbolic link to the entry (a stale link is replaced). Where
# LINK is a real directory (a checkout made before this cache), or with
# GAC_VENV_CACHE=off (or empty), the environment is made inside the checkout
# at LINK as before: kept while its gac-requirements.txt (a copy of the
# requirements) matches, and its key too (.gac-venv-key; without one, its
# Python's version), and made again from scratch otherwise.
#
# One line says whether it was reused or made (with pip's log, which stays in
# the environment as pip.log); when pip fails, the log's last 20 lines go to
# stderr and the script exits with 1.

GAC_VENV_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_gac_venv_held=()

# gac_venv_share PYTHON VENV: VENV sees PYTHON's packages after its own,
# through VENV's site-packages/torch-env.pth, which names the real path of
# PYTHON's site-packages (a cached environment is shared by every checkout:
# it must not name one checkout's link).
gac_venv_share() {
  local shared site
  shared=$("$1" -c 'import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()["purelib"]))') || return 1
  site=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  echo "$shared" > "$site/torch-env.pth"
}

# gac_venv_release: gives back the locks gac_venv --hold kept.
gac_venv_release() {
  local fd
  for fd in "${_gac_venv_held[@]}"; do
    exec {fd}>&-
  done
  _gac_venv_held=()
}

# The interpreter of --python: X.Y as the scripts find it, else a path or command.
_gac_venv_python() {
  local v=$1 p
  if [[ $v =~ ^[0-9]+\.[0-9]+$ ]]; then
    for p in "$HOME"/.pyenv/versions/"$v".*/bin/"python$v"; do
      [ -x "$p" ] && { echo "$p"; return 0; }
    done
    command -v "python$v" || true
  else
    command -v "$v" || true
  fi
}

gac_venv() {
  local label=venv name="" python="" share="" target=0 check=0 progress=0 quiet=0 hold=0
  local -a envs=() args=()
  while (($#)); do
    case $1 in
      --python|--label|--name|--pip-arg|--env|--share)
        (($# >= 2)) || { echo "gac_venv: $1 needs a value" >&2; exit 2; }
        case $1 in
          --python) python=$2 ;;
          --label) label=$2 ;;
          --name) name=$2 ;;
          --pip-arg) args+=("$2") ;;
          --env) envs+=("$2") ;;
          --share) share=$2 ;;
        esac
        shift 2 ;;
      --target) target=1; shift ;;
      --check) check=1; shift ;;
      --progress) progress=1; shift ;;
      --quiet) quiet=1; shift ;;
      --hold) hold=1; shift ;;
      --) shift; break ;;
      -*) echo "gac_venv: unknown option $1" >&2; exit 2 ;;
      *) break ;;
    esac
  done
  (($# >= 2)) && [ -n "$python" ] || { echo "gac_venv: usage: gac_venv --python P [OPTIONS] LINK REQUIREMENTS..." >&2; exit 2; }
  local link=$1
  shift
  local -a reqs=("$@")
  if [ -z "$name" ]; then
    name=$(basename "$link")
    while [[ $name == .* ]]; do name=${name#.}; done
  fi
  local shown=${link#"$GAC_VENV_ROOT"/}

  local py info exe version short r
  py=$(_gac_venv_python "$python")
  if [ -z "$py" ]; then
    if [[ $python =~ ^[0-9]+\.[0-9]+$ ]]; then echo "$label: no CPython $python" >&2; else echo "$label: no Python $python" >&2; fi
    exit 1
  fi
  info=$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable)); print(sys.version.replace("\n", " ")); print(sys.version.split()[0])') ||
    { echo "$label: $py does not run" >&2; exit 1; }
  { read -r exe; read -r version; read -r short; } <<< "$info"

  # What the environment is made of: the key's text.
  local material shared_site="" shared_req=""
  material="gac-venv 1"$'\n'"interpreter: $exe"$'\n'"version: $version"$'\n'"mode: $( ((target)) && echo target || echo venv)"
  if [ -n "$share" ]; then
    shared_site=$("$share" -c 'import os, sys, sysconfig; print(os.path.realpath(sysconfig.get_paths()["purelib"])); print(sys.prefix)') ||
      { echo "$label: $share (to share its packages) does not run" >&2; exit 1; }
    shared_req=${shared_site#*$'\n'}/gac-requirements.txt
    shared_site=${shared_site%%$'\n'*}
    material+=$'\n'"share: $shared_site"
    [ -f "$shared_req" ] && material+=$'\n'"share requirements:"$'\n'"$(cat "$shared_req")"
  fi
  for r in "${envs[@]}"; do material+=$'\n'"env: $r"; done
  for r in "${args[@]}"; do material+=$'\n'"pip-arg: $r"; done
  local -a rargs=()
  for r in "${reqs[@]}"; do
    [ -f "$r" ] || { echo "$label: no requirements file $r" >&2; exit 1; }
    material+=$'\n'"requirements:"$'\n'"$(cat "$r")"
    rargs+=(-r "$r")
  done

  local cache=${GAC_VENV_CACHE-$HOME/.cache/gac/venvs}
  case $cache in off|OFF|0) cache="" ;; esac
  local dir fd="" lock where
  if [ -n "$cache" ] && ! { [ -d "$link" ] && [ ! -L "$link" ]; }; then
    local key
    mkdir -p "$cache"
    cache=$(cd "$cache" && pwd)
    key=$(printf '%s\n' "$material" | sha256sum)
    dir=$cache/$name-${key:0:16}
    lock=$dir.lock
    exec {fd}>>"$lock"
    if ! flock -n "$fd"; then
      echo "$label: waiting for $lock (another run is making or using $(basename "$dir"))"
      flock "$fd"
    fi
    where="$shown -> $dir"
    if [ -f "$dir/.gac-venv-key" ] && [ "$(cat "$dir/.gac-venv-key")" = "$material" ]; then
      ((quiet)) || echo "$label: reused $where (Python $short)"
    else
      _gac_venv_make
    fi
    if [ ! "$link" -ef "$dir" ] || [ ! -L "$link" ]; then
      mkdir -p "$(dirname "$link")"
      rm -f "$link"
      ln -s "$dir" "$link"
    fi
    if ((hold)); then
      _gac_venv_held+=("$fd")
    else
      exec {fd}>&-
    fi
  else
    # Inside the checkout, as before the cache: kept while its requirements
    # (and, when it has one, its key) match.
    dir=$link
    where="$shown in the checkout"
    local ok=1
    if [ -L "$dir" ] || [ ! -d "$dir" ]; then
      ok=0
    elif ! ((target)) && [ ! -x "$dir/bin/python" ]; then
      ok=0
    elif ! cmp -s <(for r in "${reqs[@]}"; do cat "$r"; done) "$dir/gac-requirements.txt"; then
      ok=0
    elif [ -f "$dir/.gac-venv-key" ]; then
      [ "$(cat "$dir/.gac-venv-key")" = "$material" ] || ok=0
    elif ! ((target)); then  # made before the key: the same Python?
      [ "$("$dir/bin/python" -c 'import sys; print(sys.version.replace("\n", " "))' 2>/dev/null)" = "$version" ] || ok=0
    fi
    if ((ok)); then
      ((quiet)) || echo "$label: reused $where (Python $short)"
    else
      _gac_venv_make
    fi
  fi
}

# Makes $dir from gac_venv's variables (removing what was there first).
_gac_venv_make() {
  local log=$dir/pip.log pid
  local -a pip dest=()
  rm -rf "$dir"
  if ((target)); then
    mkdir -p "$dir"
    pip=("$py" -m pip)
    dest=(--target "$dir")
  else
    mkdir -p "$(dirname "$dir")"
    "$py" -m venv "$dir" || { echo "$label: $py -m venv $dir failed" >&2; exit 1; }
    pip=("$dir/bin/python" -m pip)
    if [ -n "$share" ]; then
      gac_venv_share "$share" "$dir" || { echo "$label: could not share $share's packages with $dir" >&2; exit 1; }
    fi
  fi
  echo "$label: making $where (Python $short): pip install ${args[*]}${args[*]:+ }${rargs[*]} (log: $log)"
  env "${envs[@]}" "${pip[@]}" install --disable-pip-version-check --progress-bar off --no-input \
    "${args[@]}" "${dest[@]}" "${rargs[@]}" > "$log" 2>&1 &
  pid=$!
  if ((progress)); then
    tail -n +1 --pid="$pid" -f "$log" | { grep --line-buffered -E '^(Collecting|Successfully installed|ERROR)' || true; }
  fi
  if ! wait "$pid"; then
    tail -20 "$log" >&2
    exit 1
  fi
  if ((check)) && ! "${pip[@]}" check >> "$log" 2>&1; then
    tail -20 "$log" >&2
    exit 1
  fi
  for r in "${reqs[@]}"; do cat "$r"; done > "$dir/gac-requirements.txt"
  printf '%s\n' "$material" > "$dir/.gac-venv-key"
}
