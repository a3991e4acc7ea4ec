/* Test-only stand-in for devin.exe, the official Devin CLI on Windows, for tests/windows/test_cli_role.py: a real
 * Windows executable, so that the cli role's "--version" checks run it under Wine. The test builds it in its own
 * temporary directory with x86_64-w64-mingw32-gcc, once per version (-DCLI_VERSION="\"1.2.3\""), and publishes it
 * to the fleet simulator as <version>/devin-windows-x64.exe. No binary is committed; it never ships. */
#include <stdio.h>
#include <string.h>

#ifndef CLI_VERSION
#error "build with -DCLI_VERSION=\"\\\"1.2.3\\\"\""
#endif

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
        printf("devin %s\n", CLI_VERSION);
        return 0;
    }
    fprintf(stderr, "devin %s (stand-in): usage: devin --version\n", CLI_VERSION);
    return 2;
}
