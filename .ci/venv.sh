# Sourced by the CI stages that need a venv of their own (stage_vllm.sh, stage_verl.sh): when the venv can be reused.
# A stage's venv is reused when its marker file names the requirements the stage asks for now (the extras as
# pyproject.toml declares them: a change there rebuilds the venv) and its key module imports.

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

# reusable VENV WANT MODULE: true when VENV was completed for WANT and `import MODULE` works in it
reusable() {
  [ -f "$1/.sgrpo-stage" ] && [ "$(cat "$1/.sgrpo-stage")" = "$2" ] && "$1/bin/python" -c "import $3" 2>/dev/null
}

# completed VENV WANT: mark VENV as complete for WANT (after its install succeeded)
completed() { echo "$2" > "$1/.sgrpo-stage"; }
