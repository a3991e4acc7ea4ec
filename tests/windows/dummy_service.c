/* Test-only Windows service for tests/windows/test_cli_role.py: the service that "runs the CLI", which the cli
 * role's handler restarts (devin_outposts_cli_restart_services). It runs until STOP and appends one line to a log
 * for each start and each stop ("start", "stop"), so that the test reads a restart from the log instead of taking
 * the handler's word for it. The log's path is its first argument (from the service's ImagePath). Built by the test
 * in its temporary directory with x86_64-w64-mingw32-gcc -municode; no binary is committed; it never ships. */
#include <windows.h>
#include <stdio.h>

static SERVICE_STATUS_HANDLE status_handle;
static SERVICE_STATUS status = {SERVICE_WIN32_OWN_PROCESS, SERVICE_START_PENDING, 0, NO_ERROR, 0, 0, 0};
static HANDLE stop_event;
static const wchar_t *log_path;

static void note(const char *line)
{
    FILE *log = _wfopen(log_path, L"a");
    if (log != NULL) {
        fprintf(log, "%s\n", line);
        fclose(log);
    }
}

static void report(DWORD state)
{
    status.dwCurrentState = state;
    status.dwControlsAccepted = state == SERVICE_RUNNING ? SERVICE_ACCEPT_STOP : 0;
    SetServiceStatus(status_handle, &status);
}

static DWORD WINAPI control(DWORD code, DWORD type, LPVOID data, LPVOID context)
{
    (void)type, (void)data, (void)context;
    if (code == SERVICE_CONTROL_STOP) {
        report(SERVICE_STOP_PENDING);
        SetEvent(stop_event);
        return NO_ERROR;
    }
    return code == SERVICE_CONTROL_INTERROGATE ? NO_ERROR : ERROR_CALL_NOT_IMPLEMENTED;
}

static void WINAPI service_main(DWORD argc, LPWSTR *argv)
{
    (void)argc, (void)argv;
    status_handle = RegisterServiceCtrlHandlerExW(L"", control, NULL);
    if (status_handle == NULL)
        return;
    stop_event = CreateEventW(NULL, TRUE, FALSE, NULL);
    note("start");
    report(SERVICE_RUNNING);
    WaitForSingleObject(stop_event, INFINITE);
    note("stop");
    report(SERVICE_STOPPED);
}

int wmain(int argc, wchar_t **argv)
{
    SERVICE_TABLE_ENTRYW table[] = {{L"", service_main}, {NULL, NULL}};
    if (argc < 2)
        return 2;
    log_path = argv[1];
    return StartServiceCtrlDispatcherW(table) ? 0 : 1;
}
