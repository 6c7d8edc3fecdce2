# Installs wasmbox on Windows (x86_64) from a release: downloads the zip, checks its SHA-256,
# puts wasmbox.exe in ~\.local\bin, runs `wasmbox setup` and `wasmbox prepare` and prints the lines that point an
# assistant's client at it.
#
#   powershell -ExecutionPolicy ByPass -c "irm https://github.com/OWNER/wasmbox/releases/latest/download/install.ps1 | iex"
#
# Settings (environment):
#   WASMBOX_RELEASE_URL  the folder of release files (default: the GitHub release,
#                        https://github.com/<repo>/releases/latest/download, or
#                        .../releases/download/v<version> when WASMBOX_VERSION is set)
#   WASMBOX_VERSION      the version to install (default: the newest in SHA256SUMS there)
#   WASMBOX_INSTALL_DIR  where wasmbox.exe goes (default: ~\.local\bin)
#   WASMBOX_SKIP_SETUP=1 do not run `wasmbox setup` (a server sets itself up on first start)
#   WASMBOX_SETUP_ONLY   runtimes for setup to fetch now, e.g. python (setup's --only)
#   WASMBOX_SKIP_PREPARE=1 do not compile the runtimes now (the Python image: ~2 min on 2 cores;
#                        a server then builds it on first start, and clients give up on a call
#                        after 60 s)
#
# The release URL is a plain folder of files, which any static file server can serve (this is
# packaging/release.sh's OUTDIR): SHA256SUMS, and wasmbox-<version>-x86_64-pc-windows-gnu.zip
# with its .sha256. Without WASMBOX_VERSION the version is read from SHA256SUMS. The zip must
# match both its .sha256 and SHA256SUMS; on a mismatch nothing is installed.
# Errors are thrown, not `exit`ed, so that `irm ... | iex` does not close the caller's shell.

# The GitHub repository releases come from (packaging/release.sh writes it in).
$DefaultRepo = 'OWNER/wasmbox'

function Write-Step([string]$Message) { Write-Host "wasmbox install: $Message" }

function Get-Download([string]$Url, [string]$Path) {
    Invoke-WebRequest -UseBasicParsing -Uri $Url -OutFile $Path
}

function Compare-Version([string]$A, [string]$B) {
    # 1 when A is newer than B, field by field, numbers as numbers.
    $x = $A -split '[.-]'; $y = $B -split '[.-]'
    for ($i = 0; $i -lt [Math]::Max($x.Count, $y.Count); $i++) {
        $p = if ($i -lt $x.Count) { $x[$i] } else { '' }
        $q = if ($i -lt $y.Count) { $y[$i] } else { '' }
        if ($p -eq $q) { continue }
        $pn = 0; $qn = 0
        if ([int]::TryParse($p, [ref]$pn) -and [int]::TryParse($q, [ref]$qn)) {
            if ($pn -gt $qn) { return 1 } else { return -1 }
        }
        if ([string]::CompareOrdinal($p, $q) -gt 0) { return 1 } else { return -1 }
    }
    return 0
}

function Install-Wasmbox {
    $ErrorActionPreference = 'Stop'
    $ProgressPreference = 'SilentlyContinue'  # Windows PowerShell 5.1 downloads far slower with it
    # Windows PowerShell 5.1 may offer only TLS 1.0 by default.
    [Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12

    $arch = $env:PROCESSOR_ARCHITECTURE
    if ($env:PROCESSOR_ARCHITEW6432) { $arch = $env:PROCESSOR_ARCHITEW6432 }
    switch ($arch) {
        'AMD64' { }
        'ARM64' { Write-Step 'Windows on ARM: installing the x86_64 build, which Windows 11 runs emulated' }
        default { throw "no wasmbox build for Windows on $arch (x86_64 only)" }
    }
    $target = 'x86_64-pc-windows-gnu'
    if ($env:WASMBOX_VERSION) { $env:WASMBOX_VERSION = $env:WASMBOX_VERSION.TrimStart('v') }

    if ($env:WASMBOX_RELEASE_URL) {
        $url = $env:WASMBOX_RELEASE_URL.TrimEnd('/')
    } else {
        if ($DefaultRepo -like 'OWNER/*') {
            throw "this install.ps1 names no release host (its repository is the placeholder $DefaultRepo): set WASMBOX_RELEASE_URL"
        }
        if ($env:WASMBOX_VERSION) {
            $url = "https://github.com/$DefaultRepo/releases/download/v$($env:WASMBOX_VERSION)"
        } else {
            $url = "https://github.com/$DefaultRepo/releases/latest/download"
        }
    }
    if ($url -notmatch '^(https://|http://(127\.0\.0\.1|localhost|\[::1\])([:/]|$))') {
        Write-Step "warning: $url is not https: the SHA-256 files come the same way, so they guard against a broken download, not a changed one"
    }
    $dir = if ($env:WASMBOX_INSTALL_DIR) { $env:WASMBOX_INSTALL_DIR } else { Join-Path $HOME '.local\bin' }
    $tmp = Join-Path ([IO.Path]::GetTempPath()) ("wasmbox-install-" + [Guid]::NewGuid().ToString('N'))
    New-Item -ItemType Directory -Path $tmp | Out-Null
    $clock = [Diagnostics.Stopwatch]::StartNew()
    $prepared = $false
    try {
        $sums = @{}
        $version = $env:WASMBOX_VERSION
        try {
            Get-Download "$url/SHA256SUMS" (Join-Path $tmp 'SHA256SUMS')
            foreach ($line in Get-Content (Join-Path $tmp 'SHA256SUMS')) {
                if ($line -match '^([0-9a-f]{64}) [ *]?(\S+)$') { $sums[$Matches[2]] = $Matches[1] }
            }
        } catch {
            if (-not $version) { throw "cannot read $url/SHA256SUMS to find the newest version (or set WASMBOX_VERSION): $_" }
        }
        if (-not $version) {
            $pattern = '^wasmbox-(.+)-' + [regex]::Escape($target) + '\.zip$'
            foreach ($file in $sums.Keys) {
                if ($file -match $pattern) {
                    $v = $Matches[1]
                    if (-not $version -or (Compare-Version $v $version) -gt 0) { $version = $v }
                }
            }
            if (-not $version) { throw "no build for $target at $url (SHA256SUMS lists none)" }
        }
        $name = "wasmbox-$version-$target"
        $zip = "$name.zip"
        $zipPath = Join-Path $tmp $zip

        Write-Step "downloading $zip from $url"
        Get-Download "$url/$zip" $zipPath
        Get-Download "$url/$zip.sha256" (Join-Path $tmp "$zip.sha256")
        $want = ((Get-Content (Join-Path $tmp "$zip.sha256") -TotalCount 1) -split '\s+')[0].ToLowerInvariant()
        if ($want -notmatch '^[0-9a-f]{64}$') { throw "$zip.sha256 holds no SHA-256; nothing installed" }
        $got = (Get-FileHash -Algorithm SHA256 -LiteralPath $zipPath).Hash.ToLowerInvariant()
        if ($got -ne $want) {
            throw "SHA-256 MISMATCH for ${zip}: expected $want (its .sha256), got $got. The download is corrupt or was tampered with; nothing installed."
        }
        if ($sums.ContainsKey($zip) -and $sums[$zip] -ne $got) {
            throw "SHA-256 MISMATCH for ${zip}: SHA256SUMS says $($sums[$zip]), the file is $got; nothing installed."
        }
        Write-Step "SHA-256 checked: $got"

        $x = Join-Path $tmp 'x'
        Expand-Archive -LiteralPath $zipPath -DestinationPath $x
        $new = Join-Path $x "$name\wasmbox.exe"
        if (-not (Test-Path -LiteralPath $new)) { throw "$zip holds no $name\wasmbox.exe; nothing installed" }
        try { $ran = (& $new --version 2>&1 | Out-String).Trim() } catch { $ran = "$_"; $LASTEXITCODE = 1 }
        if ($LASTEXITCODE -ne 0) { throw "the downloaded binary does not run on this machine ($ran); nothing installed" }
        if ($ran -ne "wasmbox $version") { throw "the downloaded binary says '$ran', not 'wasmbox $version'; nothing installed" }

        New-Item -ItemType Directory -Force -Path $dir | Out-Null
        $dir = (Resolve-Path -LiteralPath $dir).Path
        $exe = Join-Path $dir 'wasmbox.exe'
        # A running wasmbox.exe cannot be overwritten, but it can be renamed out of the way.
        if (Test-Path -LiteralPath $exe) {
            $old = "$exe.old"
            Remove-Item -LiteralPath $old -Force -ErrorAction SilentlyContinue
            Move-Item -LiteralPath $exe -Destination $old -Force
        }
        Copy-Item -LiteralPath $new -Destination $exe
        Write-Step "installed $exe ($version) in $([int]$clock.Elapsed.TotalSeconds) s"
    } finally {
        Remove-Item -LiteralPath $tmp -Recurse -Force -ErrorAction SilentlyContinue
    }

    if ($env:WASMBOX_SKIP_SETUP -eq '1') {
        Write-Step "setup skipped (WASMBOX_SKIP_SETUP=1): a server fetches its runtimes on first start, or run: & '$exe' setup"
    } else {
        $clock.Restart()
        Write-Step 'running wasmbox setup (the pinned runtimes, ~270 MB, each checked by SHA-256)'
        $setupArgs = @('setup')
        if ($env:WASMBOX_SETUP_ONLY) { $setupArgs += @('--only', $env:WASMBOX_SETUP_ONLY) }
        # From the install folder: in a wasmbox checkout, setup would fill the checkout's runtimes.
        Push-Location $dir
        try { & $exe @setupArgs } finally { Pop-Location }
        if ($LASTEXITCODE -ne 0) { throw "wasmbox setup failed; wasmbox is installed, run again: & '$exe' setup" }
        Write-Step "setup done in $([int]$clock.Elapsed.TotalSeconds) s"
        if ($env:WASMBOX_SKIP_PREPARE -eq '1') {
            Write-Step 'prepare skipped (WASMBOX_SKIP_PREPARE=1): the first start builds the Python image'
        } else {
            $clock.Restart()
            Write-Step "compiling the runtimes once (the Python image: about 2 minutes on 2 cores), so an assistant's first call answers at once"
            Push-Location $dir
            try { & $exe prepare } finally { Pop-Location }
            if ($LASTEXITCODE -eq 0) {
                $prepared = $true
                Write-Step "prepare done in $([int]$clock.Elapsed.TotalSeconds) s"
            } else {
                Write-Step "wasmbox prepare failed; the first start will try again, or run: & '$exe' prepare"
            }
        }
    }

    $json = $exe.Replace('\', '\\')
    Write-Host @"

wasmbox $version is installed at $exe

Point your assistant at it:

  Claude Code:
    claude mcp add wasmbox -- "$exe" serve

  Claude Desktop (%APPDATA%\Claude\claude_desktop_config.json), Cursor (~\.cursor\mcp.json):
    { "mcpServers": { "wasmbox": { "command": "$json", "args": ["serve"] } } }

  VS Code (.vscode\mcp.json):
    { "servers": { "wasmbox": { "type": "stdio", "command": "$json", "args": ["serve"] } } }

Try it:  & "$exe" run --language python --code 'print(6*7)'
"@
    if (-not $prepared) { Write-Host '(the first Python run prepares its image once: about 2 minutes on 2 cores)' }
    $userPath = [Environment]::GetEnvironmentVariable('Path', 'User')
    $onPath = @($env:Path -split ';') + @("$userPath" -split ';') | Where-Object { $_.TrimEnd('\') -ieq $dir.TrimEnd('\') }
    if (-not $onPath) {
        Write-Host @"

Note: $dir is not on your PATH. To run plain ``wasmbox``, add it for your user (then open a new terminal):
  [Environment]::SetEnvironmentVariable('Path', "$dir;" + [Environment]::GetEnvironmentVariable('Path', 'User'), 'User')
"@
    }
}

try {
    Install-Wasmbox
} catch {
    Write-Host "wasmbox install: $_" -ForegroundColor Red
    throw
}
