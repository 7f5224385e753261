# Sourced by the CI stages that need a venv of their own (stage_vllm.sh, stage_verl.sh): the steps they share (the
# stage's clock and venv, a fresh venv, the timing lines) and when the venv can be reused. A stage's venv is reused
# when its marker file names the requirements the stage asks for now (the extras as pyproject.toml declares them: a
# change there rebuilds the venv) and its key module imports.

# stage_start NAME: the stage's clock (t0), its venv at ${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/NAME (venv) and the pip /
# python settings of its commands
stage_start() {
  stage=$1
  t0=$(date +%s)
  venv=${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/$1
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
}

# quiet: pip's stderr without the "is ignored: it is neither ..." lines of an extra's environment markers
quiet() { grep -v "is ignored: it is neither" >&2 || true; }

# wanted PYPROJECT EXTRA... [-- EXTRA_REQUIREMENT...]: the requirements a stage's venv must hold, as one line
wanted() {
  python - "$@" <<'PY'
import sys, tomllib

pyproject, rest = sys.argv[1], sys.argv[2:]
extras, extra = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
declared = tomllib.load(open(pyproject, "rb"))["project"]["optional-dependencies"]
print(";".join(["torch==2.13.0", *sorted(r for e in extras for r in declared[e]), *extra]))
PY
}

# requirements PYPROJECT EXTRA...: the project's dependencies and those of EXTRA..., one per line: what installing the
# checkout with those extras pulls in, without building the checkout (so stages can make their venvs side by side
# while only one of them at a time builds the checkout in its folder: install_checkout)
requirements() {
  python - "$@" <<'PY'
import sys, tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join([*project["dependencies"], *(r for e in sys.argv[2:] for r in project["optional-dependencies"][e])]))
PY
}

# install_checkout PIP_ARGS...: `pip install --no-deps PIP_ARGS` (the checkout) in the stage's venv, one stage at a time
# (the build writes into the checkout's folder)
install_checkout() {
  flock "$(dirname "$venv")/.checkout.lock" "$venv/bin/python" -m pip install -q --no-deps "$@" 2> >(quiet)
}

# reusable VENV WANT MODULE: true when VENV was completed for WANT and `import MODULE` works in it
reusable() {
  [ -f "$1/.sgrpo-stage" ] && [ "$(cat "$1/.sgrpo-stage")" = "$2" ] && "$1/bin/python" -c "import $3" 2>/dev/null
}

# completed VENV WANT: mark VENV as complete for WANT (after its install succeeded)
completed() { echo "$2" > "$1/.sgrpo-stage"; }

# fresh_venv WHAT: a new venv at $venv (an old one removed) holding torch==2.13.0, the local CPU wheel (installed first:
# a looser spec from an extra would pull a CUDA build), before the stage installs WHAT
fresh_venv() {
  echo "stage_$stage: installing $1 into a fresh venv at $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python -m venv "$venv"
  "$venv/bin/python" -m pip install -q torch==2.13.0 2> >(quiet)
}

# venv_ready: the venv is complete (t1: when)
venv_ready() {
  t1=$(date +%s)
  echo "stage_$stage: venv ready in $(( t1 - t0 )) s"
}

# stage_passed: the stage's tests passed, with its times
stage_passed() {
  echo "stage_$stage: passed in $(( $(date +%s) - t0 )) s (venv $(( t1 - t0 )) s, tests $(( $(date +%s) - t1 )) s)"
}
