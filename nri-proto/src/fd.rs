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
