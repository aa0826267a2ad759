#!/usr/bin/env bash
# One-command, idempotent development setup: system build tools and EGL, .venv (Python 3.11), ROS 2 kilted wheels,
# torch (pinned: the CPU build, or with CUDA=1 the CUDA build), the Python dependencies (with the gym-aloha `sim`
# extra, Ray Serve's `ray` extra, and with CUDA=1 the `gpu` extra), the msg/ interfaces (built by CMake into .venv)
# and the package itself (editable). Re-running it only does what is missing or changed. CUDA=1 or CUDA=0 chooses the torch build (and
# swaps it if .venv has the other); without CUDA (what `make demo`, `make test` and the other targets run), the
# build .venv already has is kept, and a fresh .venv gets the CPU build.
# `scripts/setup.sh --print-pip` prints the pip installs it would run (for this decision) and does nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PY=${PYTHON:-python3.11}

TORCH_VERSION=2.13.0
if [ -z "${CUDA:-}" ]; then
  # Not given: the build .venv's torch is (torch.version.cuda is None for the CPU build); none there is the CPU build.
  if [ -x "$VENV/bin/python" ] \
      && "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' >/dev/null 2>&1; then
    CUDA=1
    echo "setup: CUDA not given, keeping .venv's CUDA build of torch (CUDA=0 switches to the CPU build)" >&2
  else
    CUDA=0
  fi
fi
if [ "$CUDA" = 1 ]; then
  # PyPI's Linux x86_64 torch wheel is the CUDA build (its CUDA libraries come as nvidia-* wheels). `===` asks for
  # exactly that version string, so a local `+cpu` build that a wheel cache or an earlier setup offers never
  # satisfies it.
  TORCH=("torch===$TORCH_VERSION")
  EXTRAS=test,sim,ray,gpu
else
  # The CPU build (`+cpu`) from the indexes pip is already set up with (a wheel cache or a local mirror answers
  # at once); else from PyTorch's CPU index. PyPI has no `+cpu` build, so the first try fails fast there.
  TORCH=("torch==$TORCH_VERSION+cpu")
  TORCH_ELSE=(--extra-index-url https://download.pytorch.org/whl/cpu)
  EXTRAS=test,sim,ray
fi
ROS_WHEELS=(-r scripts/requirements-ros.txt)
PACKAGE=(--config-settings editable_mode=compat -e ".[$EXTRAS]")
# openpi's client, for `oxygen-ros serve`'s tests and serve-bench, without its dependencies: its metadata pins
# numpy<2 (which would downgrade numpy here); it needs websockets, msgpack and pillow, which the package brings.
OPENPI_CLIENT=(--no-deps openpi-client==0.1.2)
if [ "${1:-}" = --print-pip ]; then
  torch_line="pip install ${TORCH[*]}"
  [ -z "${TORCH_ELSE[*]:-}" ] || torch_line+=" || $torch_line ${TORCH_ELSE[*]}"
  printf '%s\n' "$torch_line"
  printf 'pip install %s\n' "${ROS_WHEELS[*]}" "${PACKAGE[*]}" "${OPENPI_CLIENT[*]}"
  exit 0
fi

need_apt=()
for tool_pkg in cmake:cmake ninja:ninja-build g++:g++ make:make; do
  command -v "${tool_pkg%%:*}" >/dev/null 2>&1 || need_apt+=("${tool_pkg#*:}")
done
# Headless MuJoCo rendering (the sim extra) uses EGL through Mesa.
for lib_pkg in libegl1 libegl-mesa0 libgl1-mesa-dri; do
  dpkg -s "$lib_pkg" >/dev/null 2>&1 || need_apt+=("$lib_pkg")
done
if ((${#need_apt[@]})); then
  echo "setup: installing system packages: ${need_apt[*]}"
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned, so that nothing below can resolve a different build.
if [ -n "${TORCH_ELSE[*]:-}" ]; then
  "${PIP[@]}" "${TORCH[@]}" 2>/dev/null || "${PIP[@]}" "${TORCH[@]}" "${TORCH_ELSE[@]}"
else
  "${PIP[@]}" "${TORCH[@]}"
fi
"${PIP[@]}" "${ROS_WHEELS[@]}"
"${PIP[@]}" "${PACKAGE[@]}"
"${PIP[@]}" "${OPENPI_CLIENT[@]}"
"$VENV/bin/python" -c "import sys, torch; sys.exit((torch.version.cuda is None) == ('$CUDA' == '1'))" || {
  echo "setup: .venv's torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') is not the" \
       "$([ "$CUDA" = 1 ] && echo CUDA || echo CPU) build that CUDA=$CUDA asks for" >&2
  exit 1
}

# Interfaces: rosidl via CMake into the venv prefix (OXYGEN_ROS_INSTALL_PYTHON=OFF: the Python code comes from the
# editable install above). The wheels need the include-directory fix-up described in cmake/.
export PATH=$VENV/bin:$PATH AMENT_PREFIX_PATH=$VENV
mkdir -p build
cmake -S . -B build/interfaces -G Ninja -Wno-dev \
  -DCMAKE_INSTALL_PREFIX="$VENV" -DCMAKE_PREFIX_PATH="$VENV" -DPython3_EXECUTABLE="$VENV/bin/python" \
  -DOXYGEN_ROS_INSTALL_PYTHON=OFF -DBUILD_TESTING=OFF \
  -DCMAKE_PROJECT_INCLUDE="$ROOT/cmake/drop_missing_include_dirs.cmake" >build/interfaces.log 2>&1 \
  || { cat build/interfaces.log; exit 1; }
cmake --build build/interfaces >>build/interfaces.log 2>&1 || { cat build/interfaces.log; exit 1; }
cmake --install build/interfaces >>build/interfaces.log 2>&1 || { cat build/interfaces.log; exit 1; }
# rosidl also installs an empty oxygen_ros/__init__.py and egg-info for the generated code; in this layout they
# would shadow the editable package, whose __init__ extends its path to the generated msg/ module instead.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$SITE/oxygen_ros/__init__.py" "$SITE/oxygen_ros/__pycache__" "$SITE"/oxygen_ros-*.egg-info

"$VENV/bin/python" -c "import oxygen_ros.msg, oxygen_ros; assert oxygen_ros.__file__.startswith('$ROOT')" \
  || { echo "setup: oxygen_ros does not import from this checkout" >&2; exit 1; }
TORCH_BUILD=$("$VENV/bin/python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')
echo "setup: ready ($VENV, torch $TORCH_BUILD)"
