//! Real child processes for tests and local runs: the workspace's binaries, started with their
//! output in log files, killed when dropped; signalled (SIGTERM, SIGSTOP, ...) and restarted with
//! the same command line by fault tests.

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The directory holding the workspace's built binaries.
///
/// Test executables live in `target/<profile>/deps/`; binaries one level up. `JOINSERVICE_BIN_DIR`
/// overrides this (for installed binaries).
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("JOINSERVICE_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locating the current executable")?;
    let mut dir = exe
        .parent()
        .context("executable has no directory")?
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    Ok(dir)
}

/// The path of a workspace binary that processes of other uids can execute.
///
/// The build's own directory may sit under one only its owner can traverse (a clone in a 0700
/// directory, as CI makes as root); then the binary is hard-linked (or, across file systems,
/// copied) once per test process into a 0755 temporary directory, which is kept until the
/// machine cleans its temporary files (removing it under a running process would break its
/// restarts).
pub fn bin_for_others(name: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    static SHARED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let path = bin(name)?;
    if reachable_by_others(&path) {
        return Ok(path);
    }
    let dir = match SHARED.get() {
        Some(dir) => dir.clone(),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("joinservice-bin-")
                .tempdir()
                .context("making a directory for binaries other uids can run")?
                .keep();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            SHARED.get_or_init(|| dir).clone()
        }
    };
    publish(&path, &dir, name)
}

/// Puts `path` into `dir` as `name`, executable by everyone, once: a hard link (or a copy across
/// file systems) made under a name no other call uses, then renamed into place. Calls are
/// serialized, so two threads never link or copy onto the same file: a copy onto a hard link of
/// the build's own binary would truncate that binary under the processes running it.
fn publish(path: &Path, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PUBLISHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let _one_at_a_time = PUBLISHING.lock().unwrap_or_else(|e| e.into_inner());
    let shared = dir.join(name);
    if shared.is_file() {
        return Ok(shared);
    }
    let partial = dir.join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    if std::fs::hard_link(path, &partial).is_err() {
        std::fs::copy(path, &partial)
            .with_context(|| format!("copying {} to {}", path.display(), dir.display()))?;
    }
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &shared)?;
    Ok(shared)
}

/// Whether a process of another uid (and group) can reach and execute `path`.
fn reachable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors().all(|p| {
        p.as_os_str().is_empty()
            || std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
    })
}

/// The path of a workspace binary, with a hint if it was not built.
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "{} not found; build the binaries first: cargo build --workspace --bins",
            path.display()
        );
    }
    Ok(path)
}

/// A free loopback TCP port (bound and released; the caller binds it next).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A running child process whose output goes to `<log_dir>/<name>.log`.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    command_line: CommandLine,
}

/// What a process was started with, to start it again the same way.
#[derive(Clone, Debug)]
struct CommandLine {
    program: OsString,
    args: Vec<OsString>,
    /// `None` removes the variable.
    envs: Vec<(OsString, Option<OsString>)>,
    dir: Option<PathBuf>,
    /// The uid and gid to run as, if not the caller's.
    user: Option<RunAs>,
}

/// A uid and gid a process runs as (starting one needs root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl CommandLine {
    fn of(command: &Command, user: Option<RunAs>) -> Self {
        Self {
            program: command.get_program().to_owned(),
            args: command.get_args().map(ToOwned::to_owned).collect(),
            envs: command
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
                .collect(),
            dir: command.get_current_dir().map(Path::to_path_buf),
            user,
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        for (key, value) in &self.envs {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        if let Some(dir) = &self.dir {
            command.current_dir(dir);
        }
        if let Some(user) = self.user {
            run_as(&mut command, user);
        }
        command
    }
}

/// Makes `command` run as `user`, with no supplementary groups (std drops them when it changes
/// the uid).
fn run_as(command: &mut Command, user: RunAs) {
    use std::os::unix::process::CommandExt;
    command.uid(user.uid).gid(user.gid);
}

/// A signal [`Process::signal`] sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Asks for a graceful shutdown (drain, then exit).
    Term,
    /// Kills at once; nothing is drained.
    Kill,
    /// Freezes the process: it holds its sockets but answers nothing (a hung process).
    Stop,
    /// Resumes a stopped process.
    Cont,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
        }
    }
}

fn start(name: &str, command: &mut Command, log: &Path, append: bool) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = file.try_clone()?;
    command.stdin(Stdio::null()).stdout(file).stderr(err);
    command.spawn().with_context(|| format!("starting {name}"))
}

impl Process {
    /// Starts `command`, sending stdout and stderr to a log file named after `name`.
    pub fn spawn(name: &str, command: &mut Command, log_dir: &Path) -> anyhow::Result<Self> {
        Self::spawn_as(name, command, log_dir, None)
    }

    /// [`Process::spawn`], running as `user` if given (and again as `user` on restart). The log
    /// file is opened by this process, so the user need not be able to write the log directory.
    pub fn spawn_as(
        name: &str,
        command: &mut Command,
        log_dir: &Path,
        user: Option<RunAs>,
    ) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        if let Some(user) = user {
            run_as(command, user);
        }
        let child = start(name, command, &log, false)?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
            command_line: CommandLine::of(command, user),
        })
    }

    /// Starts the process again with the same program, arguments, environment and log file
    /// (appended to), after killing it if it still runs: a crashed service coming back as its
    /// supervisor would restart it. The caller waits for it to serve again.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let mut command = self.command_line.command();
        self.child = start(&self.name, &mut command, &self.log, true)?;
        Ok(())
    }

    /// Sends `signal` without waiting for its effect.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{}", signal.name()))
            .arg(self.id().to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{} {} failed", signal.name(), self.id());
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit, and reaps it.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The name it was started under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails if the process has exited, with its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}); its log:\n{}", self.name, self.log());
        }
        Ok(())
    }

    /// Waits until `ready` holds, failing early if the process dies.
    pub fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            // Dead first: a port this process failed to bind may be served by someone else.
            self.check_running()?;
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not ready ({what}) after {timeout:?}; its log:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until a Unix socket accepts connections.
    pub fn wait_for_socket(&mut self, path: &Path) -> anyhow::Result<()> {
        self.wait_until(
            &format!("socket {}", path.display()),
            Duration::from_secs(20),
            || std::os::unix::net::UnixStream::connect(path).is_ok(),
        )
    }

    /// Waits until this process says it listens on `addr`'s port and the address accepts
    /// connections. The log line is what tells this process's listener from another process that
    /// took the port first (then this one fails to bind and exits).
    pub fn wait_for_listener(&mut self, addr: SocketAddr) -> anyhow::Result<()> {
        let port = format!(":{}", addr.port());
        let log = self.log.clone();
        self.wait_until(
            &format!("listening on {addr}"),
            Duration::from_secs(20),
            || {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                said.lines()
                    .any(|l| l.contains("listening") && l.contains(&port))
                    && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                        .is_ok()
            },
        )
    }

    /// Waits until a TCP address accepts connections.
    pub fn wait_for_tcp(&mut self, addr: SocketAddr) -> anyhow::Result<()> {
        self.wait_until(&format!("tcp {addr}"), Duration::from_secs(20), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })
    }

    /// Sends SIGTERM and waits for the process to exit, up to `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        self.signal(Signal::Term)?;
        self.wait_exit(timeout)
            .with_context(|| format!("after SIGTERM; its log:\n{}", self.log()))
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Many tests of one process start their systems at once, each asking for the same binary:
    /// the build's binary must come out whole, and so must the published one.
    #[test]
    fn publishing_one_binary_from_many_threads_at_once_leaves_it_whole() {
        let build = tempfile::tempdir().unwrap();
        let binary = build.path().join("token-issuer");
        let content: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        for round in 0..20 {
            std::fs::write(&binary, &content).unwrap();
            let shared = tempfile::tempdir().unwrap();
            let barrier = std::sync::Barrier::new(16);
            let published: Vec<PathBuf> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..16)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            publish(&binary, shared.path(), "token-issuer").unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(
                std::fs::read(&binary).unwrap().len(),
                content.len(),
                "round {round}: the build's binary was truncated"
            );
            for path in published {
                assert_eq!(std::fs::read(&path).unwrap(), content, "round {round}");
            }
            let left: Vec<_> = std::fs::read_dir(shared.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, ["token-issuer"], "round {round}: {left:?}");
        }
    }
}
