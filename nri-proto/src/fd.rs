//! Taking ownership of the socket the runtime passes to pre-launched plugins as a file descriptor.
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Takes ownership of `fd` as a unix stream socket after checking it is an open socket.
pub(crate) fn take_socket_fd(fd: RawFd) -> std::io::Result<std::os::unix::net::UnixStream> {
    let st = nix::sys::stat::fstat(
        // SAFETY: fstat only reads the descriptor table entry; an invalid fd yields EBADF.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .map_err(std::io::Error::from)?;
    if st.st_mode & libc_sock_mask() != libc_sock_mode() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("fd {fd} is not a socket"),
        ));
    }
    // SAFETY: the fd is open (fstat succeeded) and is a socket; the stub takes it exactly once
    // (the builder consumes NRI_PLUGIN_SOCKET) so no other owner closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(std::os::unix::net::UnixStream::from(owned))
}

fn libc_sock_mask() -> u32 {
    nix::sys::stat::SFlag::S_IFMT.bits()
}

fn libc_sock_mode() -> u32 {
    nix::sys::stat::SFlag::S_IFSOCK.bits()
}

/// Registers `stream` with the current tokio reactor for the given readiness only.
///
/// tokio's own `UnixStream` always registers for readability and writability; with edge-triggered
/// epoll every byte the peer reads then wakes this process for a writability nobody waits for.
pub(crate) fn register(
    stream: std::os::unix::net::UnixStream,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::unix::net::UnixStream>> {
    // SAFETY: `UnixStream` owns its descriptor: it stays open and refers to the same socket until
    // the stream is dropped, which happens only when the `AsyncFd` (its sole owner) is dropped, and
    // `as_raw_fd` always returns that one descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(stream, interest) }
        .map_err(std::io::Error::from)
}
