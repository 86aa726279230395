//! The control binary's command-line contract (`nvidia-cuda-mps-control`), through
//! `tokio::process` with no shell: `-f` runs a control daemon in the foreground; without
//! arguments the binary is a client that reads commands on stdin and sends them to the daemon
//! named by `CUDA_MPS_PIPE_DIRECTORY`, printing the replies.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::plan::MpsDirs;

/// The daemon's GPU (`CUDA_VISIBLE_DEVICES`): its one GPU is device 0 to it.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// The daemon's pipe directory.
pub const CUDA_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The daemon's log directory.
pub const CUDA_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";

/// Talking to a control daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The binary could not be started.
    #[error("starting {binary}")]
    Spawn {
        /// The control binary.
        binary: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Writing the command or reading the reply failed.
    #[error("`{command}`")]
    Io {
        /// The command.
        command: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The client did not finish in time.
    #[error("`{command}` did not answer within {after:?}")]
    Timeout {
        /// The command.
        command: String,
        /// The timeout.
        after: Duration,
    },
    /// The client exited with an error (typically: no daemon answers at the pipe directory).
    #[error("`{command}` failed ({status}): {output}")]
    Failed {
        /// The command.
        command: String,
        /// The exit status.
        status: std::process::ExitStatus,
        /// What it printed.
        output: String,
    },
}

/// How to reach one daemon: the binary, its directories and a timeout per command.
#[derive(Debug, Clone)]
pub struct Control {
    /// The control binary.
    pub binary: PathBuf,
    /// The daemon's directories.
    pub dirs: MpsDirs,
    /// Deadline for one command.
    pub timeout: Duration,
}

impl Control {
    /// The binary with this daemon's directories in its environment, killed when dropped.
    fn command(&self) -> Command {
        let mut c = Command::new(&self.binary);
        c.env(CUDA_MPS_PIPE_DIRECTORY, &self.dirs.pipe)
            .env(CUDA_MPS_LOG_DIRECTORY, &self.dirs.log)
            .kill_on_drop(true);
        c
    }

    fn spawn(&self, mut command: Command) -> Result<Child, ControlError> {
        command.spawn().map_err(|source| ControlError::Spawn {
            binary: self.binary.clone(),
            source,
        })
    }

    /// Sends one command and returns the reply (stdout).
    ///
    /// # Errors
    /// [`ControlError`] when the client cannot start, times out or exits with an error.
    pub async fn send(&self, command: &str) -> Result<String, ControlError> {
        let mut client = self.command();
        client
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.spawn(client)?;
        let io = |source| ControlError::Io {
            command: command.to_string(),
            source,
        };
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(format!("{command}\n").as_bytes())
                .await
                .map_err(io)?;
        }
        let out = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| ControlError::Timeout {
                command: command.to_string(),
                after: self.timeout,
            })?
            .map_err(io)?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(ControlError::Failed {
                command: command.to_string(),
                status: out.status,
                output: format!("{}{}", stdout.trim(), stderr.trim()),
            });
        }
        Ok(stdout)
    }

    /// `get_server_list`: the MPS servers running (one per user with connected clients).
    ///
    /// # Errors
    /// As [`Control::send`].
    pub async fn server_list(&self) -> Result<Vec<String>, ControlError> {
        Ok(parse_server_list(&self.send("get_server_list").await?))
    }

    /// Starts `<binary> -f` for the GPU (or MIG device) `uuid`. Its stderr is logged.
    ///
    /// # Errors
    /// [`ControlError::Spawn`] when the binary cannot be started.
    pub fn spawn_daemon(&self, uuid: &str) -> Result<Child, ControlError> {
        let mut daemon = self.command();
        daemon
            .arg("-f")
            .env(CUDA_VISIBLE_DEVICES, uuid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = self.spawn(daemon)?;
        if let Some(stderr) = child.stderr.take() {
            let uuid = uuid.to_string();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::warn!(gpu = %uuid, "MPS control daemon: {line}");
                }
            });
        }
        Ok(child)
    }
}

/// The server PIDs in a `get_server_list` reply (one per line; empty when no client is
/// connected).
pub fn parse_server_list(reply: &str) -> Vec<String> {
    reply
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists() {
        assert!(parse_server_list("").is_empty());
        assert!(parse_server_list("\n  \n").is_empty());
        assert_eq!(parse_server_list("1234\n5678\n"), ["1234", "5678"]);
    }

    #[tokio::test]
    async fn a_missing_binary_is_a_spawn_error() {
        let c = Control {
            binary: PathBuf::from("/nonexistent/nvidia-cuda-mps-control"),
            dirs: crate::plan::mps_dirs(std::path::Path::new("/tmp"), "GPU-x"),
            timeout: Duration::from_secs(1),
        };
        let e = c.send("get_server_list").await.unwrap_err();
        assert!(matches!(e, ControlError::Spawn { .. }), "{e}");
        assert!(e
            .to_string()
            .contains("/nonexistent/nvidia-cuda-mps-control"));
    }
}
