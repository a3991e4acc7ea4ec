/* The Windows stand-in devin-remote for the windows test stage: an .exe that the simulator publishes as
 * devin-remote_<sha>_windows_x64.exe, so that the worker downloads, verifies and spawns a real Windows
 * executable. It runs the simulator's stand-in remote (standin.py, plain Python) with the Windows CPython, passing
 * its own arguments on, and exits with the script's exit code. Both paths are fixed when it is built
 * (scripts/windows/setup.sh: -DSTANDIN_PYTHON=... -DSTANDIN_SCRIPT=..., wide string literals).
 *
 * The script runs inside a job object that is killed when this process ends, so that TerminateProcess on the
 * remote (the worker's forced stop) also ends the script, as it would end a real single-process remote. */
#include <windows.h>
#include <stdio.h>
#include <wchar.h>

#ifndef STANDIN_PYTHON
#error "build with -DSTANDIN_PYTHON=L\"C:\\\\...\\\\python.exe\""
#endif
#ifndef STANDIN_SCRIPT
#error "build with -DSTANDIN_SCRIPT=L\"C:\\\\...\\\\standin.py\""
#endif

/* Our own command line without argv[0], as Windows gave it (quoting kept). */
static const wchar_t *arguments(const wchar_t *line)
{
    int quoted = 0;
    for (; *line; line++) {
        if (*line == L'"')
            quoted = !quoted;
        else if (!quoted && (*line == L' ' || *line == L'\t'))
            break;
    }
    while (*line == L' ' || *line == L'\t')
        line++;
    return line;
}

int wmain(void)
{
    const wchar_t *rest = arguments(GetCommandLineW());
    size_t size = wcslen(STANDIN_PYTHON) + wcslen(STANDIN_SCRIPT) + wcslen(rest) + 16;
    wchar_t *line = HeapAlloc(GetProcessHeap(), 0, size * sizeof(wchar_t));
    STARTUPINFOW startup = {sizeof(startup)};
    PROCESS_INFORMATION child;
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits = {0};
    HANDLE job = CreateJobObjectW(NULL, NULL);
    DWORD code = 1;

    if (!line)
        return 1;
    _snwprintf(line, size, L"\"%ls\" \"%ls\" %ls", STANDIN_PYTHON, STANDIN_SCRIPT, rest);
    line[size - 1] = 0;
    if (job) {
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof(limits));
    }
    if (!CreateProcessW(NULL, line, NULL, NULL, TRUE, CREATE_SUSPENDED, NULL, NULL, &startup, &child)) {
        fwprintf(stderr, L"devin-remote stand-in: cannot start %ls (error %lu)\n", STANDIN_PYTHON, GetLastError());
        return 1;
    }
    if (job)
        AssignProcessToJobObject(job, child.hProcess);
    ResumeThread(child.hThread);
    WaitForSingleObject(child.hProcess, INFINITE);
    GetExitCodeProcess(child.hProcess, &code);
    return (int)code;
}
