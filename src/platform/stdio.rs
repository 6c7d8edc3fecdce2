//! stdin and stdout as the protocol's transport.

/// stdin and stdout as non-blocking sockets, when both are. A socket cannot be reopened with
/// its own flags, so O_NONBLOCK lands on the inherited description: harmless, since nothing else
/// here reads stdin or writes stdout, and children get neither; but not when stderr shares
/// stdout's socket (`2>&1`), whose log writes must not fail with EAGAIN.
#[cfg(unix)]
pub fn sockets() -> Option<(tokio::net::UnixStream, tokio::net::UnixStream)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let socket = |fd: std::os::fd::BorrowedFd<'_>| {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        let meta = file.metadata().ok()?;
        meta.file_type()
            .is_socket()
            .then(|| (std::os::fd::OwnedFd::from(file), (meta.dev(), meta.ino())))
    };
    let (input, _) = socket(std::io::stdin().as_fd())?;
    let (output, out_id) = socket(std::io::stdout().as_fd())?;
    if socket(std::io::stderr().as_fd()).is_some_and(|(_, err_id)| err_id == out_id) {
        return None;
    }
    let stream = |fd: std::os::fd::OwnedFd| {
        let s = std::os::unix::net::UnixStream::from(fd);
        s.set_nonblocking(true).ok()?;
        tokio::net::UnixStream::from_std(s).ok()
    };
    Some((stream(input)?, stream(output)?))
}

/// Windows: none; stdio stays on tokio's handles.
#[cfg(not(unix))]
pub fn sockets() -> Option<(tokio::io::Empty, tokio::io::Sink)> {
    None
}
