#!/bin/sh
# Installs the Vulkan loader and Mesa's software driver (llvmpipe) when they are missing, plus glslc
# (only needed to rebuild shaders). Uses sudo only when not root. Idempotent and quiet when all is there.
set -e
need=""
ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || need="$need libvulkan1"
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need="$need mesa-vulkan-drivers"
if [ "${LLAMAVK_WITH_GLSLC:-0}" = 1 ]; then command -v glslc >/dev/null 2>&1 || need="$need glslc"; fi
[ -z "$need" ] && exit 0
echo "installing:$need"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq $need >/dev/null
