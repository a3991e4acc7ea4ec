/* bcryptprimitives.dll for Wine 8, which has none: pydantic-core (through Rust's standard library) imports
 * ProcessPrng from it, and without it `import pydantic_core` fails to load. Windows 10+ ships this export; here it is
 * the same thing over BCryptGenRandom, the system's preferred random number generator. Built by
 * scripts/windows/setup.sh with mingw-w64 into the Wine prefix's system32; never committed as a binary. */
#include <windows.h>
#include <bcrypt.h>

/* BOOL ProcessPrng(PBYTE pbData, SIZE_T cbData): always TRUE on Windows (it cannot fail there); FALSE here only if
 * BCryptGenRandom does, so that a caller never takes unfilled bytes as random. */
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T size)
{
    while (size > 0) {
        ULONG chunk = size > 0x40000000 ? 0x40000000 : (ULONG)size;
        if (!BCRYPT_SUCCESS(BCryptGenRandom(NULL, data, chunk, BCRYPT_USE_SYSTEM_PREFERRED_RNG)))
            return FALSE;
        data += chunk;
        size -= chunk;
    }
    return TRUE;
}
