#!/usr/bin/env bash
# A long experiment's own checkout: `benchmarks/worktree.sh DIR [REV]` makes a git worktree of REV (default
# HEAD) in DIR with a light virtual environment that installs only this project (and the example plugin)
# from DIR, taking every dependency (vLLM's CPU build included) from the main checkout's .venv. Runs started
# from DIR/.venv/bin/python then
# use DIR's code, so edits in the main checkout do not change an experiment halfway. Start them from inside
# DIR: `python -m` and `-c` put the working folder first on sys.path, and another checkout there wins.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: benchmarks/worktree.sh DIR [REV]}
rev=${2:-HEAD}
git worktree add --detach "$dir" "$rev"

# light_venv BASE NAME: DIR/NAME, a venv of BASE's interpreter whose dependencies are BASE's site-packages
light_venv() {
  local base=$1 name=$2 base_site python site
  base_site=$("$base/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  python=$("$base/bin/python" -c "import sys; print(sys.executable)")
  "$python" -m venv "$dir/$name"
  site=$("$dir/$name/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # A plain path in a .pth file joins sys.path without its own .pth files being run, so the main checkout's
  # editable install (a .pth hook) stays out and DIR's is the only agentgym_opsd.
  echo "$base_site" > "$site/_main_checkout_deps.pth"
  # The venv's bundled setuptools is too old for pyproject.toml's license field; the base venv's is used.
  "$dir/$name/bin/python" -m pip uninstall -y -q setuptools
  "$dir/$name/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$dir" -e "$dir/examples/custom_env"
  (cd "$dir" && "$name/bin/python" -c "import agentgym_opsd.trainer.loop as m; print('[worktree] $name: the trainer from', m.__file__)")
}

light_venv .venv .venv
