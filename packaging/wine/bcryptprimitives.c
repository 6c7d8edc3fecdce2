/* For packaging/smoke.sh only: Debian's wine 8 has no bcryptprimitives.dll, whose ProcessPrng
 * Rust's standard library (1.78+) imports on Windows for random numbers; every Windows since 10
 * has it. This stand-in answers from advapi32's RtlGenRandom and goes into the smoke's own wine
 * prefix, never into a release. */
#include <windows.h>
/* advapi32's RtlGenRandom */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
  while (len > 0) {
    ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
    if (!SystemFunction036(data, n)) return FALSE;
    data += n; len -= n;
  }
  return TRUE;
}
