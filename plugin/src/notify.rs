//! systemd readiness notification (`sd_notify`): READY=1, STATUS=, STOPPING=1.
//!
//! The unit is `Type=notify`: systemd considers the daemon started only when it says READY=1, which
//! the daemon does once the gate is open (the runtime synchronized and the claims API answers).
//! The protocol is one datagram per message on the unix socket named by `NOTIFY_SOCKET` (a path,
//! or `@name` for the abstract namespace). Without `NOTIFY_SOCKET` (run by hand, in tests, or
//! launched by the runtime) every call is a no-op.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;

/// Environment variable systemd sets for `Type=notify` services.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The socket named by `NOTIFY_SOCKET` could not be reached.
    #[error(
        "cannot send {what} to the systemd notify socket {socket}: {source}; \
         systemd will time the start out unless the unit's Type is changed"
    )]
    Send {
        /// The message kind (READY, STATUS, STOPPING).
        what: &'static str,
        /// The socket as given in `NOTIFY_SOCKET`.
        socket: String,
        /// The underlying error.
        source: io::Error,
    },
    /// `NOTIFY_SOCKET` holds something that is neither a path nor `@name`.
    #[error(
        "NOTIFY_SOCKET={socket} is not an absolute path or an @abstract name; \
         it is set by systemd, so check the unit or the environment it was started from"
    )]
    BadAddress {
        /// The value found.
        socket: String,
    },
}

#[derive(Clone, Debug)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// Sends state changes to systemd; a no-op when there is no notify socket.
#[derive(Clone, Debug, Default)]
pub struct Notifier {
    socket: Option<(String, Target)>,
}

impl Notifier {
    /// Read `NOTIFY_SOCKET` once. An unset or empty variable gives a no-op notifier.
    pub fn from_env() -> Result<Self, NotifyError> {
        match std::env::var(NOTIFY_SOCKET_ENV) {
            Ok(value) if !value.is_empty() => Self::with_socket(&value),
            _ => Ok(Self::disabled()),
        }
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Self { socket: None }
    }

    /// A notifier for the socket `value` (an absolute path, or `@name` for an abstract socket),
    /// as systemd would put it in `NOTIFY_SOCKET`.
    pub fn with_socket(value: &str) -> Result<Self, NotifyError> {
        let target = if let Some(name) = value.strip_prefix('@') {
            Target::Abstract(name.as_bytes().to_vec())
        } else if value.starts_with('/') {
            Target::Path(PathBuf::from(value))
        } else {
            return Err(NotifyError::BadAddress {
                socket: value.to_owned(),
            });
        };
        Ok(Self {
            socket: Some((value.to_owned(), target)),
        })
    }

    /// Whether calls will send anything.
    pub fn is_enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Tell systemd the daemon is ready (the gate is open), with a status line.
    pub fn ready(&self, status: &str) -> Result<(), NotifyError> {
        self.send("READY", &format!("READY=1\nSTATUS={}", one_line(status)))
    }

    /// Update the free-form status line `systemctl status` shows.
    pub fn status(&self, status: &str) -> Result<(), NotifyError> {
        self.send("STATUS", &format!("STATUS={}", one_line(status)))
    }

    /// Tell systemd the daemon is shutting down.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.send("STOPPING", "STOPPING=1")
    }

    fn send(&self, what: &'static str, message: &str) -> Result<(), NotifyError> {
        let Some((socket, target)) = &self.socket else {
            return Ok(());
        };
        let err = |source| NotifyError::Send {
            what,
            socket: socket.clone(),
            source,
        };
        let sock = UnixDatagram::unbound().map_err(err)?;
        let addr = match target {
            Target::Path(path) => SocketAddr::from_pathname(path).map_err(err)?,
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name).map_err(err)?
            }
        };
        let sent = sock.send_to_addr(message.as_bytes(), &addr).map_err(err)?;
        if sent != message.len() {
            return Err(err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", message.len()),
            )));
        }
        Ok(())
    }
}

/// A status is one line: newlines would start new (unintended) assignments.
fn one_line(status: &str) -> String {
    status.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver() -> (tempfile::TempDir, String, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        (dir, path.to_str().unwrap().to_owned(), sock)
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn ready_status_stopping_arrive_as_datagrams() {
        let (_dir, path, sock) = receiver();
        let n = Notifier::with_socket(&path).unwrap();
        assert!(n.is_enabled());
        n.ready("gate open, 2 claims").unwrap();
        assert_eq!(recv(&sock), "READY=1\nSTATUS=gate open, 2 claims");
        n.status("reconnecting\nto runtime").unwrap();
        assert_eq!(recv(&sock), "STATUS=reconnecting to runtime");
        n.stopping().unwrap();
        assert_eq!(recv(&sock), "STOPPING=1");
    }

    #[test]
    fn abstract_socket_is_reached() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("nri-accel-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        Notifier::with_socket(&format!("@{name}"))
            .unwrap()
            .ready("up")
            .unwrap();
        assert_eq!(recv(&sock), "READY=1\nSTATUS=up");
    }

    #[test]
    fn disabled_sends_nothing_and_succeeds() {
        let n = Notifier::disabled();
        assert!(!n.is_enabled());
        n.ready("x").unwrap();
        n.stopping().unwrap();
    }

    #[test]
    fn missing_socket_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let err = Notifier::with_socket(path.to_str().unwrap())
            .unwrap()
            .ready("x")
            .unwrap_err();
        assert!(err.to_string().contains("absent.sock"), "{err}");
    }

    #[test]
    fn relative_address_is_refused() {
        let err = Notifier::with_socket("run/notify").unwrap_err();
        assert!(matches!(err, NotifyError::BadAddress { .. }), "{err}");
    }
}
