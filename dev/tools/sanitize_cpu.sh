#!/usr/bin/env bash
# Run the CPU kernel's parity and property tests with the kernel built under AddressSanitizer
# and UndefinedBehaviorSanitizer (NPUDET_CPU_SANITIZE=1, a separate build). Python itself is
# not instrumented, so the ASan runtime is preloaded; leak checking is off (CPython's own
# allocations at exit are not the kernel's). Any report fails the run.
#   bash dev/tools/sanitize_cpu.sh                 # parity + property tests, cpu implementation
#   bash dev/tools/sanitize_cpu.sh -k float64      # extra pytest arguments
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash tools/setup.sh >/dev/null
cxx="${CXX:-c++}"
asan="$("$cxx" -print-file-name=libasan.so)"
ubsan="$("$cxx" -print-file-name=libubsan.so)"
if [ ! -e "$asan" ] || [ ! -e "$ubsan" ]; then
  echo "sanitize_cpu: $cxx has no libasan.so / libubsan.so (install gcc's sanitizer runtimes)" >&2
  exit 2
fi
export NPUDET_CPU_SANITIZE=1
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# The tests below fall back to other implementations when `cpu` is missing: first make sure
# the sanitized build is the one that loads, or stop.
LD_PRELOAD="$asan:$ubsan" .venv/bin/python -c "
from npudet.ops.msda.backends import cpu_library as lib
why = lib.unavailable_reason()
assert why is None, f'the sanitized cpu kernel is unavailable: {why}'
assert lib.sanitized(), 'the cpu kernel that loaded is not the sanitized build'
print(f'[sanitize_cpu] testing the sanitized {lib.isa()} build: {lib.require()}')
"
LD_PRELOAD="$asan:$ubsan" exec .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/ops/msda/backends/test_msda_parity.py tests/ops/msda/test_msda_property.py -k "cpu or auto" "$@"
