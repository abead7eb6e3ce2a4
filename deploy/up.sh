#!/usr/bin/env bash
# The three-member compose cluster with one command, on machines with or without an image
# registry and with Compose v2 (`docker compose`) or v1 (`docker-compose`):
#
#   deploy/up.sh up [ARGS]     build the image, `up -d ARGS`, wait until every member is healthy
#   deploy/up.sh build [ARGS]  build the image only (ARGS go to docker build)
#   deploy/up.sh down [ARGS]   stop and remove the containers (ARGS -v: the data volumes too)
#   deploy/up.sh CMD [ARGS]    any other compose command (ps, logs, stop, start, ...)
#   deploy/up.sh spark-demo [ARGS]  (the spark profile, below) submit the example pipeline
#
# --tls anywhere in ARGS (or RAFTKV_TLS=1): the TLS profile, docker-compose.tls.yml over
# docker-compose.yml: https client and peer URLs, peers authenticated by certificate. `up`
# first makes a throwaway CA and a member certificate in RAFTKV_TLS_DIR (default deploy/tls/,
# ignored by git; an existing set is reused) with kvserver.tls.make_cluster_pki, using
# RAFTKV_PYTHON (default .venv/bin/python, else python3; it needs the `cryptography`
# package), and then prints the RAFTKV_CACERT to use. The member key is made readable by the
# containers' user (uid 2379): owned by it when up.sh runs as root, else mode 0644 — it is a
# throwaway key for a local cluster; for anything else mount your own certificates.
#
# --monitoring anywhere in ARGS (or RAFTKV_MONITORING=1): the `monitoring` profile, Prometheus
# (deploy/monitoring) beside the members, scraping them and evaluating raftkv's alert rules;
# `up` also builds its image (RAFTKV_PROMETHEUS_IMAGE, from Debian's prometheus package on the
# base image chosen below) and waits until it is ready (RAFTKV_PROMETHEUS_PORT, default 9090).
# Give it to every command of such a cluster, `down` included. Not with --tls: it scrapes
# over plain http.
#
# --spark anywhere in ARGS (or RAFTKV_SPARK=1): the `spark` profile, docker-compose.spark.yml
# over docker-compose.yml: the members archive to moto's S3 server in its own container, and a
# Spark standalone master and two workers run beside them. `up` also builds the Spark image
# (RAFTKV_SPARK_IMAGE, default raftkv-spark:latest; deploy/spark/Dockerfile on the same base
# image, its Python packages from deploy/spark/wheelhouse/, filled once by
# deploy/build-wheelhouse.sh --spark) and waits until both workers are registered. Give it to
# every command of such a cluster, `down` included. Not with --tls (see docs/spark.md).
#   spark-demo [ARGS]  builds raftkv's wheel (deploy/spark/dist/, with RAFTKV_PYTHON as for
#                      --tls) and runs, in a one-off container of the spark-driver service,
#                      spark-submit --master spark://spark-master:7077 --py-files <the wheel>
#                      with kvserver.spark.demo as the application: every member in
#                      --endpoints, output in the shared volume (/data/spark-demo-out), the
#                      changefeed's archiveUrl on the S3 container. ARGS go to the demo after
#                      those (a later flag wins); RAFTKV_SPARK_SUBMIT_ARGS go to spark-submit.
#                      Implies --spark.
#   spark-submit APP [ARGS]  the same spark-submit with APP, a Python file of this
#                      repository (mounted read-only at /opt/raftkv-src in the driver's
#                      container), e.g. benchmarks/spark_bench.py --endpoints
#                      http://raftkv1:2379,http://raftkv2:2379,http://raftkv3:2379
#
# (`make compose-up` / `make compose-down` run the first and third.)
#
# Base image, for `up` and `build`:
#   RAFTKV_BASE_IMAGE set       that image (the plain Dockerfile path with your choice);
#   python:3.11-slim is local   it, pip inside the build reaches PyPI (the plain Dockerfile);
#   raftkv-base:bookworm local  the offline path (below), without asking the registry;
#   otherwise                   `docker pull python:3.11-slim`; if the registry cannot be
#                               reached, the offline path: deploy/build-base-image.sh builds
#                               raftkv-base:bookworm from Debian's packages (as root, sudo
#                               otherwise; debootstrap, installed with apt-get when
#                               missing), deploy/build-
#                               wheelhouse.sh fills deploy/wheelhouse/ on the host, and the
#                               image is built with PIP_INSTALL_ARGS=--no-index.
# Every other setting is docker-compose.yml's (RAFTKV_IMAGE, RAFTKV1_CLIENT_PORT, ...,
# RAFTKV_PUBLISH_ADDR, RAFTKV_CLUSTER_TOKEN); COMPOSE_PROJECT_NAME picks the project.
# The image is built by `docker build` with the compose file's build arguments and tagged
# RAFTKV_IMAGE (its build stage RAFTKV_IMAGE-build); an image replaced by a rebuild is
# removed (when no container uses it), so rebuilds do not pile up. Exit status: the failing command's; 3 when a prerequisite is missing (no Docker,
# no Compose, or no registry and no way to build the offline base image).
set -euo pipefail
cd "$(dirname "$0")/.."

COMPOSE_FILE=deploy/docker-compose.yml
REGISTRY_BASE=python:3.11-slim
OFFLINE_BASE=raftkv-base:bookworm
IMAGE="${RAFTKV_IMAGE:-raftkv:latest}"
HEALTH_TIMEOUT_S="${RAFTKV_UP_TIMEOUT_S:-180}"
PROMETHEUS_IMAGE="${RAFTKV_PROMETHEUS_IMAGE:-raftkv-prometheus:latest}"

say() { echo "deploy/up.sh: $*" >&2; }
missing() { say "$*"; exit 3; }

command -v docker >/dev/null || missing "docker is not installed"
docker info >/dev/null 2>&1 || missing "the Docker daemon does not answer (docker info failed)"
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
else
  missing "neither the Compose v2 plugin (docker compose) nor docker-compose (v1) is installed"
fi
compose=("${compose[@]}" -f "$COMPOSE_FILE")

# --tls (anywhere) or RAFTKV_TLS=1: the TLS overlay. The flag is removed from the arguments.
tls="${RAFTKV_TLS:-0}"
monitoring="${RAFTKV_MONITORING:-0}"
spark="${RAFTKV_SPARK:-0}"
case "${1:-}" in spark-demo | spark-submit) spark=1 ;; esac
args=()
for arg in "$@"; do
  case "$arg" in
    --tls) tls=1 ;;
    --monitoring) monitoring=1 ;;
    --spark) spark=1 ;;
    *) args+=("$arg") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
[ "$tls" = true ] && tls=1
TLS_DIR="${RAFTKV_TLS_DIR:-deploy/tls}"
case "$TLS_DIR" in /*) ;; *) TLS_DIR="$PWD/$TLS_DIR" ;; esac
if [ "$tls" = 1 ]; then
  compose=("${compose[@]}" -f deploy/docker-compose.tls.yml)
  export RAFTKV_TLS_DIR="$TLS_DIR"
fi
scheme=http
[ "$tls" = 1 ] && scheme=https
[ "$monitoring" = true ] && monitoring=1
if [ "$monitoring" = 1 ]; then
  [ "$tls" = 1 ] && { say "--monitoring scrapes over plain http: not with --tls"; exit 2; }
  export COMPOSE_PROFILES="${COMPOSE_PROFILES:+$COMPOSE_PROFILES,}monitoring"
fi

[ "$spark" = true ] && spark=1
SPARK_IMAGE="${RAFTKV_SPARK_IMAGE:-raftkv-spark:latest}"
if [ "$spark" = 1 ]; then
  [ "$tls" = 1 ] && { say "--spark runs the members over plain http: not with --tls"; exit 2; }
  compose=("${compose[@]}" -f deploy/docker-compose.spark.yml)
  export COMPOSE_PROFILES="${COMPOSE_PROFILES:+$COMPOSE_PROFILES,}spark"
fi

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

choose_base() {
  if [ -n "${RAFTKV_BASE_IMAGE:-}" ]; then
    say "base image $RAFTKV_BASE_IMAGE (RAFTKV_BASE_IMAGE)"
    return
  fi
  if image_exists "$REGISTRY_BASE"; then
    say "base image $REGISTRY_BASE (found locally)"
    return
  fi
  if ! image_exists "$OFFLINE_BASE"; then
    say "pulling $REGISTRY_BASE ..."
    local err
    if err="$(timeout 300 docker pull -q "$REGISTRY_BASE" 2>&1 >/dev/null)"; then
      say "base image $REGISTRY_BASE (pulled)"
      return
    fi
    say "cannot pull $REGISTRY_BASE: the image registry cannot be reached here"
    say "  (${err//$'\n'/ })"
    say "building the offline base image $OFFLINE_BASE from Debian's packages instead"
    say "  (deploy/build-base-image.sh: debootstrap, about a minute; done once)"
    local as_root=()
    if [ "$(id -u)" != 0 ]; then
      command -v sudo >/dev/null ||
        missing "building the offline base image needs root (debootstrap) and sudo is missing"
      as_root=(sudo)
    fi
    if ! command -v debootstrap >/dev/null; then
      command -v apt-get >/dev/null ||
        missing "debootstrap is not installed and there is no apt-get to install it"
      say "installing Debian's debootstrap package (apt-get install debootstrap)"
      "${as_root[@]}" apt-get install -y -q debootstrap >/dev/null ||
        missing "apt-get install debootstrap failed"
    fi
    "${as_root[@]}" deploy/build-base-image.sh "$OFFLINE_BASE"
  else
    say "base image $OFFLINE_BASE (found locally; the offline path, no registry needed)"
  fi
  say "dependencies from deploy/wheelhouse/ (deploy/build-wheelhouse.sh), pip --no-index"
  deploy/build-wheelhouse.sh
  export RAFTKV_BASE_IMAGE="$OFFLINE_BASE" RAFTKV_PIP_INSTALL_ARGS=--no-index
}

build() {
  choose_base
  # docker build itself (not `compose build`, which Compose v1 runs once per service): the
  # build stage gets a tag of its own, so the image a rebuild replaces can be removed instead
  # of piling up untagged (the engine's layer cache stays).
  local tag target before
  for tag in "$IMAGE-build" "$IMAGE"; do
    target=()
    [ "$tag" = "$IMAGE-build" ] && target=(--target build)
    before="$(image_id "$tag")"
    docker build -f deploy/Dockerfile "${target[@]}" "$@" \
      --build-arg "BASE_IMAGE=${RAFTKV_BASE_IMAGE:-$REGISTRY_BASE}" \
      --build-arg "PIP_INSTALL_ARGS=${RAFTKV_PIP_INSTALL_ARGS:-}" -t "$tag" .
    if [ -n "$before" ] && [ "$before" != "$(image_id "$tag")" ]; then
      # Fails while a container still runs the old image: retried after `up`.
      docker image rm "$before" >/dev/null 2>&1 || stale+=" $before"
    fi
  done
  if [ "$spark" = 1 ]; then
    deploy/build-wheelhouse.sh --spark
    before="$(image_id "$SPARK_IMAGE")"
    docker build -f deploy/spark/Dockerfile \
      --build-arg "BASE_IMAGE=${RAFTKV_BASE_IMAGE:-$REGISTRY_BASE}" \
      -t "$SPARK_IMAGE" deploy/spark
    if [ -n "$before" ] && [ "$before" != "$(image_id "$SPARK_IMAGE")" ]; then
      docker image rm "$before" >/dev/null 2>&1 || stale+=" $before"
    fi
  fi
  if [ "$monitoring" = 1 ]; then
    before="$(image_id "$PROMETHEUS_IMAGE")"
    docker build -f deploy/monitoring/Dockerfile \
      --build-arg "BASE_IMAGE=${RAFTKV_BASE_IMAGE:-$REGISTRY_BASE}" \
      -t "$PROMETHEUS_IMAGE" deploy/monitoring
    if [ -n "$before" ] && [ "$before" != "$(image_id "$PROMETHEUS_IMAGE")" ]; then
      docker image rm "$before" >/dev/null 2>&1 || stale+=" $before"
    fi
  fi
}

wait_healthy() {
  local addr="${RAFTKV_PUBLISH_ADDR:-127.0.0.1}"
  [ "$addr" = 0.0.0.0 ] && addr=127.0.0.1
  local urls=("$scheme://$addr:${RAFTKV1_CLIENT_PORT:-2379}"
              "$scheme://$addr:${RAFTKV2_CLIENT_PORT:-22379}"
              "$scheme://$addr:${RAFTKV3_CLIENT_PORT:-32379}")
  local ca=()
  [ "$tls" = 1 ] && ca=("RAFTKV_HEALTHCHECK_CACERT=$TLS_DIR/ca.pem")
  local deadline=$(( $(date +%s) + HEALTH_TIMEOUT_S )) url
  for url in "${urls[@]}"; do
    until env "${ca[@]+"${ca[@]}"}" RAFTKV_HEALTHCHECK_URL="$url/health" \
        python3 deploy/healthcheck.py >/dev/null 2>&1; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        say "$url is not healthy after ${HEALTH_TIMEOUT_S} s; see: ${compose[*]} logs"
        exit 1
      fi
      sleep 1
    done
  done
  say "cluster healthy: ${urls[*]}"
  if [ "$monitoring" = 1 ]; then
    local prom="http://$addr:${RAFTKV_PROMETHEUS_PORT:-9090}"
    until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "$prom/-/ready" >/dev/null 2>&1; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        say "Prometheus at $prom is not ready after ${HEALTH_TIMEOUT_S} s; see: ${compose[*]} logs prometheus"
        exit 1
      fi
      sleep 1
    done
    say "Prometheus: $prom (alerts: $prom/alerts)"
  fi
  if [ "$spark" = 1 ]; then
    wait_spark "$deadline"
  fi
  say "export RAFTKV_ENDPOINTS=$(IFS=,; echo "${urls[*]}")"
  [ "$tls" = 1 ] && say "export RAFTKV_CACERT=$TLS_DIR/ca.pem"
  return 0
}

# Both workers registered with the master (its /json/ lists them ALIVE) and S3 answering,
# asked from inside the network.
wait_spark() {
  local deadline="$1" alive
  until alive="$("${compose[@]}" exec -T spark-master curl -sf http://localhost:8080/json/ 2>/dev/null |
                 sed -n 's/.*"aliveworkers" *: *\([0-9]*\).*/\1/p')" && [ "${alive:-0}" -ge 2 ] &&
        "${compose[@]}" exec -T s3 curl -sf -o /dev/null http://localhost:5000/ 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "the Spark workers are not registered (or S3 does not answer) after ${HEALTH_TIMEOUT_S} s; see: ${compose[*]} logs"
      exit 1
    fi
    sleep 1
  done
  say "Spark: spark://spark-master:7077 with $alive workers (web UI http://${RAFTKV_PUBLISH_ADDR:-127.0.0.1}:${RAFTKV_SPARK_UI_PORT:-8080}); S3: http://s3:5000"
}

# raftkv's wheel, for spark-submit --py-files: built on this host from the working tree.
build_wheel() {
  local py="${RAFTKV_PYTHON:-}"
  if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
  fi
  local tmp
  mkdir -p deploy/spark/dist
  tmp="$(mktemp -d deploy/spark/dist/.build.XXXXXX)"
  "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp" . >&2 ||
    missing "cannot build raftkv's wheel with $py (it needs pip and setuptools; set RAFTKV_PYTHON)"
  rm -rf build ./*.egg-info
  wheel="$(cd "$tmp" && ls raftkv-*.whl)"
  # renamed into place: a driver started earlier may still be serving the previous one
  mv -f "$tmp/$wheel" "deploy/spark/dist/$wheel"
  rmdir "$tmp"
}

# spark-submit, in a one-off container of spark-driver, of APP (a path in this repository,
# which is mounted read-only at /opt/raftkv-src) with raftkv's wheel.
spark_submit() {
  local app="$1"
  shift
  build_wheel
  local submit_args=()
  [ -n "${RAFTKV_SPARK_SUBMIT_ARGS:-}" ] && read -r -a submit_args <<<"$RAFTKV_SPARK_SUBMIT_ARGS"
  # Client deploy mode: the driver runs here, in the one-off container, and the executors
  # connect back to it at its address on the compose network. --py-files ships the wheel
  # and puts it on the path of the driver's Python, but not on that of the Python workers
  # that run a Python data source (Spark 4.x): the ones the driver's JVM starts to plan it
  # (PYTHONPATH, which the JVM hands down, does that) and the executors' (their
  # PYTHONPATH, spark.executorEnv.PYTHONPATH, names the wheel in the executor's working
  # directory, where --py-files land).
  "${compose[@]}" run --rm -T -v "$PWD:/opt/raftkv-src:ro" spark-driver \
    bash -c 'export PYTHONPATH="/opt/raftkv-src/deploy/spark/dist/$0${PYTHONPATH:+:$PYTHONPATH}"
      exec spark-submit --master spark://spark-master:7077 \
        --conf spark.driver.host="$(hostname -i | cut -d" " -f1)" \
        --conf spark.driver.bindAddress=0.0.0.0 \
        --conf spark.executorEnv.PYTHONPATH="$0" \
        --py-files "/opt/raftkv-src/deploy/spark/dist/$0" "$@"' \
    "$wheel" "${submit_args[@]+"${submit_args[@]}"}" "/opt/raftkv-src/$app" "$@"
}

spark_demo() {
  spark_submit deploy/spark/demo_main.py \
    --endpoints http://raftkv1:2379,http://raftkv2:2379,http://raftkv3:2379 \
    --out /data/spark-demo-out --archive-url s3://raftkv-archive/compose "$@"
}

make_certs() {
  local py="${RAFTKV_PYTHON:-}"
  if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
  fi
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$TLS_DIR" <<'PY' ||
import sys
from kvserver.tls import make_cluster_pki
make_cluster_pki(sys.argv[1], ["raftkv1", "raftkv2", "raftkv3"])
PY
    missing "cannot make the TLS certificates with $py (it needs the cryptography package: .venv/bin/pip install cryptography, or set RAFTKV_PYTHON)"
  # The containers run as uid/gid 2379 and must read the member key.
  chmod 755 "$TLS_DIR"
  if [ "$(id -u)" = 0 ]; then
    chown 2379:2379 "$TLS_DIR/member-key.pem"
  else
    chmod 644 "$TLS_DIR/member-key.pem"
  fi
  say "TLS: CA and member certificate in $TLS_DIR (throwaway; keep *-key.pem private)"
}

stale=""
case "${1:-}" in
  up)
    shift
    [ "$tls" = 1 ] && make_certs
    build
    "${compose[@]}" up -d --no-build "$@"
    for id in $stale; do docker image rm "$id" >/dev/null 2>&1 || true; done
    wait_healthy
    ;;
  build)
    shift
    build "$@"
    ;;
  spark-demo)
    shift
    spark_demo "$@"
    ;;
  spark-submit)
    shift
    [ $# -ge 1 ] || { say "usage: deploy/up.sh spark-submit APP [ARGS]"; exit 2; }
    spark_submit "$@"
    ;;
  "")
    say "usage: deploy/up.sh up|build|down|COMPOSE-COMMAND [ARGS]"
    exit 2
    ;;
  *)
    exec "${compose[@]}" "$@"
    ;;
esac
