//! Launching a plugin process the way a runtime does: a socket on fd 3 and only the NRI variables
//! in the environment.
#![allow(unsafe_code)]

use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;

/// Spawns `program` with `fd` duplicated onto fd 3, `NRI_PLUGIN_SOCKET=3` and `env`, and nothing
/// else in its environment (as containerd launches pre-installed plugins).
pub fn spawn_with_fd3(
    program: &str,
    fd: RawFd,
    env: &[(&str, &str)],
) -> std::io::Result<tokio::process::Child> {
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear().env("NRI_PLUGIN_SOCKET", "3");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: the closure runs in the forked child before exec and only calls dup2, which is
    // async-signal-safe; dup2 also clears close-on-exec on the new fd 3.
    unsafe {
        cmd.pre_exec(move || {
            let old = std::os::fd::BorrowedFd::borrow_raw(fd);
            if fd == 3 {
                let flags = nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty());
                return nix::fcntl::fcntl(old, flags)
                    .map(|_| ())
                    .map_err(std::io::Error::from);
            }
            // fd 3 must stay open in the child: give up ownership of the duplicate.
            nix::unistd::dup2_raw(old, 3)
                .map(|dup| {
                    let _ = std::os::fd::IntoRawFd::into_raw_fd(dup);
                })
                .map_err(std::io::Error::from)
        });
    }
    tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
}
