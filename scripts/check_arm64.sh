#!/usr/bin/env bash
# The kernels' ARM64 builds, checked without ARM hardware: tests/kernels/cpp/driver.cpp (the
# torch-free core) cross-compiled for NEON with the dot product (variant neon), for the int8
# matrix multiply (variant i8mm) and for the scalar reference, run under `qemu-aarch64 -cpu max`,
# and compared with the x86-64 scalar build's outputs; the x86 SIMD builds this CPU runs are
# compared too (avxvnni's VEX build, which needs a CPU with AVX-VNNI, is at least compiled; its
# EVEX twin runs on AVX-512 machines). The driver checks rows of passes 1 to 8 wide against
# one-row passes and prints one PASS or FAIL line per check, naming the machine and the variant;
# exit status 1 on any FAIL, 2 if a tool is missing.
#
#   matrices (q4, q5, q6, q8, f16, f32): every build's bits equal the x86 scalar build's (no libm)
#   the one-layer model:   bit for bit within a platform; across platforms within TOLERANCE of the
#                          largest logit, as the rotary embedding's sin and cos come from each libm
#
# Needs g++, aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user).
set -uo pipefail
cd "$(dirname "$0")/.."

TOLERANCE=1e-4
DRIVER=tests/kernels/cpp/driver.cpp
CXXFLAGS=(-std=c++17 -O3 -ffp-contract=off -Wall -Wextra -Ispecchat/kernels)

missing=()
for tool in g++ aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "check_arm64: ${missing[*]} not found (Debian: apt-get install g++-aarch64-linux-gnu qemu-user)"
  exit 2
fi
if [[ "$(uname -m)" != x86_64 ]]; then
  echo "check_arm64: run it on x86-64 (the reference outputs are the x86 scalar build's)"
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# build NAME COMPILER FLAGS...: the driver for one instruction set, or a FAIL line.
build() {
  local name=$1 compiler=$2
  shift 2
  if ! "$compiler" "${CXXFLAGS[@]}" "$@" "$DRIVER" -o "$work/$name" 2>"$work/$name.log"; then
    echo "FAIL $name: the driver does not build:"
    sed 's/^/  /' "$work/$name.log"
    failed=1
    return 1
  fi
  mkdir -p "$work/out-$name"
}

# run NAME [REF NAME TOLERANCE]: runs a built driver (aarch64 builds under qemu's most capable CPU,
# which has the dot product and the int8 matrix multiply).
run() {
  local name=$1
  shift
  local runner=()
  [[ $name == aarch64-* ]] && runner=(qemu-aarch64 -cpu max)
  "${runner[@]}" "$work/$name" "$work/out-$name" "$@" || failed=1
}

has() { for flag in "$@"; do grep -qw "$flag" /proc/cpuinfo || return 1; done; }

# The x86 reference, and the x86 SIMD variants this CPU runs (flags as specchat/kernels/__init__.py's).
build x86-scalar g++ -DSPECCHAT_ISA_SCALAR && run x86-scalar
if [[ -d $work/out-x86-scalar && -s $work/out-x86-scalar/layer.bin ]]; then
  if has avx2 fma f16c; then
    build x86-avx2 g++ -mavx2 -mfma -mf16c -DSPECCHAT_ISA_AVX2 &&
      run x86-avx2 "$work/out-x86-scalar" "x86-64 scalar" 0
  fi
  if has avx2 fma f16c avx512_vnni avx512vl; then  # avxvnni's EVEX twin
    build x86-avxvnni-evex g++ -mavx2 -mfma -mf16c -DSPECCHAT_AVXVNNI_EVEX -DSPECCHAT_ISA_AVXVNNI &&
      run x86-avxvnni-evex "$work/out-x86-scalar" "x86-64 scalar" 0
  fi
  # avxvnni as an Intel laptop runs it (VEX): run where the CPU has AVX-VNNI, else built only, so
  # that the one build no CI machine may run still compiles.
  if build x86-avxvnni g++ -mavx2 -mfma -mf16c -mavxvnni -DSPECCHAT_ISA_AVXVNNI; then
    if has avx2 fma f16c avx_vnni; then
      run x86-avxvnni "$work/out-x86-scalar" "x86-64 scalar" 0
    else
      echo "PASS x86-64 avxvnni: the VEX build compiles (this CPU lacks avx_vnni to run it)"
    fi
  fi
  if has avx512f avx512bw avx512vl avx512_vnni f16c fma; then
    build x86-avx512 g++ -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mf16c -mfma -DSPECCHAT_ISA_AVX512 &&
      run x86-avx512 "$work/out-x86-scalar" "x86-64 scalar" 0
  fi
  # ARM64, statically linked so that qemu needs no ARM libraries.
  build aarch64-scalar aarch64-linux-gnu-g++ -static -DSPECCHAT_ISA_SCALAR &&
    run aarch64-scalar "$work/out-x86-scalar" "x86-64 scalar" "$TOLERANCE"
  for variant in "neon -march=armv8.2-a+dotprod -DSPECCHAT_ISA_NEON" "i8mm -march=armv8.6-a+i8mm -DSPECCHAT_ISA_I8MM"; do
    read -r name flags <<<"$variant"
    # shellcheck disable=SC2086  # the flags are words
    build "aarch64-$name" aarch64-linux-gnu-g++ -static $flags || continue
    if [[ -s $work/out-aarch64-scalar/layer.bin ]]; then
      run "aarch64-$name" "$work/out-aarch64-scalar" "aarch64 scalar" 0
    else
      run "aarch64-$name" "$work/out-x86-scalar" "x86-64 scalar" "$TOLERANCE"
    fi
  done
else
  echo "FAIL x86 scalar: no reference outputs"
  failed=1
fi
exit "$failed"
