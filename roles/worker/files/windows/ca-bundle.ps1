# devin.outposts.worker (Windows): the CA bundle the worker (DEVIN_CA_BUNDLE) and pip (--cert) trust: the public
# CAs that pip ships (its vendored certifi) followed by the private CA, like the system bundle on Linux.
# Run by ansible.windows.win_powershell; reports a change only when the bundle's content changes.
[CmdletBinding()]
param (
    [Parameter(Mandatory = $true)][string]$Python,
    [Parameter(Mandatory = $true)][string]$CaFile,
    [Parameter(Mandatory = $true)][string]$Bundle
)
$ErrorActionPreference = 'Stop'

$certifi = & $Python -c 'import pip._vendor.certifi as c; print(c.where())'
if ($LASTEXITCODE -ne 0 -or -not $certifi) {
    throw "Could not find pip's CA bundle with $Python (exit $LASTEXITCODE)"
}
$public = [System.IO.File]::ReadAllText($certifi.Trim())
$private = [System.IO.File]::ReadAllText($CaFile)
$wanted = $public.TrimEnd() + "`n" + $private.Trim() + "`n"

$current = $null
if (Test-Path -LiteralPath $Bundle -PathType Leaf) {
    $current = [System.IO.File]::ReadAllText($Bundle)
}
if ($current -ceq $wanted) {
    $Ansible.Changed = $false
}
else {
    [System.IO.File]::WriteAllText($Bundle, $wanted, [System.Text.UTF8Encoding]::new($false))
    $Ansible.Changed = $true
}
