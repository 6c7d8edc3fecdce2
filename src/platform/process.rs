//! Processes and threads: the toolchain's children kept together and ended together, servers
//! that end with wasmbox, whether another process lives, this process's memory, and the
//! priority of background threads.

use std::io;
use std::process::{Child, Command};

/// Sets up `cmd` to start in its own process group with an address-space cap its children
/// inherit (Unix). Windows: nothing before the start; [`Group::join`] puts it in a job.
pub fn bound(cmd: &mut Command, address_space: u64) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // setrlimit, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: address_space as libc::rlim_t,
                    rlim_max: address_space as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (cmd, address_space);
}

/// A started child and everything it starts, ended together: its process group (Unix), or a
/// job object that also caps its committed memory and ends it with wasmbox (Windows).
pub struct Group {
    #[cfg(unix)]
    pgid: i32,
    #[cfg(windows)]
    job: Option<windows::Job>,
}

impl Group {
    /// The group of a child started from a [`bound`] command. Windows: the child joins a new
    /// job at once; what it starts in the moment before is not in it (go starts its compiler
    /// later). A job that cannot be made leaves the child alone, killed by itself.
    pub fn join(child: &Child, address_space: u64) -> Group {
        #[cfg(unix)]
        return {
            let _ = address_space;
            Group {
                pgid: child.id() as i32,
            }
        };
        #[cfg(windows)]
        Group {
            job: windows::Job::new(address_space)
                .and_then(|j| j.assign(child_handle(child)).map(|()| j))
                .map_err(|e| tracing::warn!("a job object for the build: {e}"))
                .ok(),
        }
    }

    /// Kills the child and everything it started, and waits until they are gone, so their
    /// directory can go.
    pub fn kill(&self, child: &mut Child) {
        #[cfg(unix)]
        {
            use std::time::{Duration, Instant};
            // SAFETY: a plain syscall on the process group the child leads.
            unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
            let _ = child.kill();
            let _ = child.wait();
            // Its children die too and are reaped by init; give them a moment to go.
            let until = Instant::now() + Duration::from_millis(200);
            // SAFETY: as above; signal 0 only asks whether the group still exists.
            while unsafe { libc::kill(-self.pgid, 0) } == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        #[cfg(windows)]
        {
            if let Some(job) = &self.job {
                job.terminate();
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(windows)]
fn child_handle(child: &Child) -> windows_sys::Win32::Foundation::HANDLE {
    use std::os::windows::io::AsRawHandle;
    child.as_raw_handle() as _
}

/// Starts `cmd` so that it ends with wasmbox however wasmbox ends (a drop kills it too, but a
/// process that exits or is killed drops nothing): Linux's `PR_SET_PDEATHSIG`; Windows: a job
/// object this process holds, closed (and its members ended) when it ends. macOS has neither:
/// the child sees its stdin close and is expected to end then.
pub fn spawn_tied(cmd: &mut tokio::process::Command) -> io::Result<tokio::process::Child> {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    #[cfg(windows)]
    if let Some(h) = child.raw_handle() {
        windows::tie(h as _);
    }
    Ok(child)
}

/// What a child started with an empty environment still needs from the OS: nothing on Unix;
/// on Windows `SystemRoot` (its DLLs and sockets are found through it) and `TEMP`.
pub fn essential_env() -> Vec<(&'static str, String)> {
    #[cfg(windows)]
    return ["SystemRoot", "TEMP"]
        .into_iter()
        .filter_map(|k| Some((k, std::env::var(k).ok()?)))
        .collect();
    #[cfg(not(windows))]
    Vec::new()
}

/// Whether the process `pid` is known to be gone (a scratch root's owner). Unsure is alive.
pub fn process_gone(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        unsafe {
            libc::kill(pid, 0) != 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        }
    }
    #[cfg(windows)]
    return windows::gone(pid);
}

/// Runs `f` as the process exits normally (the C runtime's `atexit`, on every platform).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registers a plain function to run at exit.
    unsafe { libc::atexit(f) };
}

/// This process's resident set (Linux's `/proc/self/status`); `None` elsewhere.
pub fn rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Makes the calling thread yield the CPU to request threads: background work (idle-session
/// saves, hashing) must not delay an answer on a machine with few cores. Linux: nice 10 for the
/// thread; macOS: the utility QoS class; Windows: below-normal priority.
pub fn lower_priority() {
    // SAFETY (all): plain calls on the calling thread; failure leaves the priority as it was.
    #[cfg(target_os = "linux")]
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
    #[cfg(target_os = "macos")]
    unsafe {
        libc::pthread_set_qos_class_self_np(libc::qos_class_t::QOS_CLASS_UTILITY, 0);
    }
    #[cfg(windows)]
    windows::thread_priority(windows_sys::Win32::System::Threading::THREAD_PRIORITY_BELOW_NORMAL);
}

/// As [`lower_priority`], and further: the thread runs only on CPU time nobody else wants.
/// Linux: `SCHED_IDLE`; macOS: the background QoS class; Windows: idle priority.
pub fn idle_priority() {
    lower_priority();
    // SAFETY: as above; lowering one's own policy needs no privilege.
    #[cfg(target_os = "linux")]
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param);
    }
    #[cfg(target_os = "macos")]
    unsafe {
        libc::pthread_set_qos_class_self_np(libc::qos_class_t::QOS_CLASS_BACKGROUND, 0);
    }
    #[cfg(windows)]
    windows::thread_priority(windows_sys::Win32::System::Threading::THREAD_PRIORITY_IDLE);
}

#[cfg(windows)]
mod windows {
    use std::io;
    use std::sync::OnceLock;

    use windows_sys::Win32::Foundation::{
        CloseHandle, ERROR_INVALID_PARAMETER, GetLastError, HANDLE, STILL_ACTIVE,
    };
    use windows_sys::Win32::System::JobObjects::{
        AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_JOB_MEMORY,
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
        JobObjectExtendedLimitInformation, SetInformationJobObject, TerminateJobObject,
    };
    use windows_sys::Win32::System::Threading::{
        GetCurrentThread, GetExitCodeProcess, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
        SetThreadPriority, THREAD_PRIORITY,
    };

    /// A job object whose members end when it is closed.
    pub(super) struct Job(HANDLE);

    // SAFETY: a kernel handle, usable from any thread.
    unsafe impl Send for Job {}
    unsafe impl Sync for Job {}

    impl Job {
        /// Kill-on-close, and a cap on the members' committed memory when `memory` > 0.
        pub(super) fn new(memory: u64) -> io::Result<Job> {
            // SAFETY: no name, default security; the handle is checked.
            let h = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
            if h.is_null() {
                return Err(io::Error::last_os_error());
            }
            let job = Job(h);
            // SAFETY: a plain-data struct, all zero is its empty value.
            let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
            info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
            if memory > 0 {
                info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY;
                info.JobMemoryLimit = usize::try_from(memory).unwrap_or(usize::MAX);
            }
            // SAFETY: the job's handle and a struct of the class's size.
            let ok = unsafe {
                SetInformationJobObject(
                    job.0,
                    JobObjectExtendedLimitInformation,
                    (&raw const info).cast(),
                    std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
                )
            };
            if ok == 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(job)
        }

        pub(super) fn assign(&self, process: HANDLE) -> io::Result<()> {
            // SAFETY: two live handles.
            if unsafe { AssignProcessToJobObject(self.0, process) } == 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }

        pub(super) fn terminate(&self) {
            // SAFETY: the job's live handle.
            unsafe { TerminateJobObject(self.0, 1) };
        }
    }

    impl Drop for Job {
        fn drop(&mut self) {
            // SAFETY: closed once, here.
            unsafe { CloseHandle(self.0) };
        }
    }

    /// Puts a process in the job this process holds until it ends.
    pub(super) fn tie(process: HANDLE) {
        static JOB: OnceLock<Option<Job>> = OnceLock::new();
        let job = JOB.get_or_init(|| {
            Job::new(0)
                .map_err(|e| tracing::warn!("a job object for servers: {e}"))
                .ok()
        });
        if let Some(job) = job
            && let Err(e) = job.assign(process)
        {
            tracing::warn!("a server not tied to wasmbox's life: {e}");
        }
    }

    pub(super) fn gone(pid: u32) -> bool {
        // SAFETY: opening for a query only; the handle is closed below.
        let h = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
        if h.is_null() {
            // SAFETY: reads this thread's last error.
            return unsafe { GetLastError() } == ERROR_INVALID_PARAMETER;
        }
        let mut code = 0u32;
        // SAFETY: a live handle and a place for the code.
        let ok = unsafe { GetExitCodeProcess(h, &mut code) };
        // SAFETY: opened above.
        unsafe { CloseHandle(h) };
        ok != 0 && code != STILL_ACTIVE as u32
    }

    pub(super) fn thread_priority(p: THREAD_PRIORITY) {
        // SAFETY: the calling thread's pseudo-handle.
        unsafe { SetThreadPriority(GetCurrentThread(), p) };
    }
}

/// SIGINT or SIGTERM (Unix); Ctrl-C elsewhere.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_lives_and_an_ended_child_is_gone() {
        assert!(!process_gone(std::process::id()));
        let exe = std::env::current_exe().unwrap();
        // The test binary asked for no test runs none and ends at once.
        let mut child = Command::new(exe)
            .arg("--exact")
            .arg("no such test")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_gone(pid));
    }

    #[test]
    fn a_group_is_ended_whole() {
        // A child that starts a grandchild and both sleep; ending the group ends both.
        #[cfg(unix)]
        let mut cmd = {
            let mut c = Command::new("/bin/sh");
            c.args(["-c", "sleep 30 & echo $!; wait"]);
            c
        };
        #[cfg(windows)]
        let mut cmd = {
            let mut c = Command::new("cmd");
            c.args(["/C", "ping -n 30 127.0.0.1 >NUL"]);
            c
        };
        cmd.stdout(std::process::Stdio::piped());
        bound(&mut cmd, 1 << 32);
        let mut child = cmd.spawn().unwrap();
        let group = Group::join(&child, 1 << 32);
        #[cfg(unix)]
        let grandchild: u32 = {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            line.trim().parse().unwrap()
        };
        let t = std::time::Instant::now();
        group.kill(&mut child);
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        assert!(process_gone(child.id()));
        #[cfg(unix)]
        {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            // Dead once gone, or a zombie that its new parent has yet to reap.
            let dead = || {
                process_gone(grandchild)
                    || std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| {
                        s.rsplit(')')
                            .next()
                            .is_some_and(|r| r.trim_start().starts_with('Z'))
                    })
            };
            while !dead() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(dead(), "the grandchild outlived its group");
        }
    }
}
