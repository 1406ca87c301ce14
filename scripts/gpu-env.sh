# Source on an offline GPU machine (see ../shared/gpu/pack-offline-runtime.sh, which fills .gl/ .whl/
# and, with --with-lavapipe, .lvp/): Vulkan loader, Python wheels, and optionally Mesa's llvmpipe as a
# second, different-driver device.   Usage: . scripts/gpu-env.sh [--lavapipe]
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# The lent machines set PYTHONDONTWRITEBYTECODE=1: every process would compile every module it imports
# (the vulkan package's 1 MB of wrappers alone: 0.28 s). An installed package has its bytecode (pip
# compiles at install), so let the first run write it, as timings of second runs assume.
unset PYTHONDONTWRITEBYTECODE
if [ "${1:-}" = "--lavapipe" ] && [ -d .lvp ]; then
  mkdir -p /opt/lvp
  for f in .lvp/*.deb; do dpkg -x "$f" /opt/lvp; done
  L=/opt/lvp/usr/lib/x86_64-linux-gnu
  printf '{"file_format_version":"1.0.0","ICD":{"api_version":"1.1.230","library_path":"%s/libvulkan_lvp.so"}}' $L >/opt/lvp/lvp.json
  export LLAMAVK_LVP_LIB=$L LLAMAVK_LVP_ICD=/opt/lvp/lvp.json
fi
# Run a command with llvmpipe added as a second driver (only that command sees it).
with_lavapipe() { LD_LIBRARY_PATH=$LLAMAVK_LVP_LIB VK_ADD_DRIVER_FILES=$LLAMAVK_LVP_ICD "$@"; }
