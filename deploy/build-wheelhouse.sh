#!/usr/bin/env bash
# Fill deploy/wheelhouse/ with wheels of raftkv's runtime dependencies (and the build backend,
# setuptools), built or downloaded on this host, so the image can be built without network
# access from inside the build:
#
#   deploy/build-wheelhouse.sh [--force]
#   docker build -f deploy/Dockerfile --build-arg PIP_INSTALL_ARGS=--no-index -t raftkv .
#
# The members' wheelhouse, deploy/wheelhouse/, holds the dependencies and the `archive` extra
# (s3fs: a member archives to S3 with --archive-url s3://...).
# --spark fills deploy/spark/wheelhouse/ instead, for the Spark image of the compose `spark`
# profile (deploy/spark/Dockerfile): the dependencies, the `spark` and `archive` extras
# (pyspark, pyarrow, pandas, s3fs) and moto's S3 server; about 600 MB, mostly pyspark's jars.
#
# PYTHON (default: .venv/bin/python if present, else python3) runs `pip wheel`; it must be
# the same Python minor version as the image's python3 (3.11 for Debian bookworm and for
# python:3.11-slim), because compiled wheels are tagged with it.
# Cached: the wheelhouse remembers the dependency list and Python tag it was built for
# (.stamp) and is left alone while they are unchanged (--force rebuilds it).
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
spark=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --spark) spark=1 ;;
    *) echo "build-wheelhouse: unknown argument $arg (want --force, --spark)" >&2; exit 2 ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
out=deploy/wheelhouse
[ "$spark" = 1 ] && out=deploy/spark/wheelhouse
log() { echo "build-wheelhouse: $*" >&2; }

reqs="$("$PYTHON" - "$spark" <<'PY'
import sys
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
extras = project["project"]["optional-dependencies"]
print("\n".join(project["project"]["dependencies"]))
print("\n".join(extras["archive"]))
print("\n".join(project["build-system"]["requires"]))
if sys.argv[1] == "1":
    print("\n".join(extras["spark"]))
    print("\n".join(d for d in extras["dev"] if d.startswith("moto")))
PY
)"
tag="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
stamp="$(printf '%s\n%s\n' "$tag" "$reqs" | sha256sum | cut -d' ' -f1)"

if [ "$force" = 0 ] && [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
  log "$out is up to date for $tag ($(ls "$out"/*.whl | wc -l) wheels; --force rebuilds it)"
  exit 0
fi

start=$(date +%s)
mkdir -p "$out"
rm -f "$out"/*.whl "$out/.stamp" "$out/requirements.txt"
reqfile="$(mktemp)"
trap 'rm -f "$reqfile"' EXIT
printf '%s\n' "$reqs" >"$reqfile"
log "building wheels for $tag with $PYTHON into $out"
"$PYTHON" -m pip wheel --progress-bar off --wheel-dir "$out" -r "$reqfile"
printf '%s\n' "$reqs" >"$out/requirements.txt"  # what deploy/spark/Dockerfile installs
echo "$stamp" >"$out/.stamp"
log "$(ls "$out"/*.whl | wc -l) wheels in $(( $(date +%s) - start )) s"
