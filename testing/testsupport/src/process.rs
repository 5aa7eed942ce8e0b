//! Real child processes for tests and local runs: the workspace's binaries, started with their
//! output in log files, killed when dropped; signalled (SIGTERM, SIGSTOP, ...) and restarted with
//! the same command line by fault tests.
//!
//! Every child ends with the process that started it, however that process ends (a signal, even
//! SIGKILL, or a crash): see [`spawn_tied`].

use std::ffi::{OsStr, OsString};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
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
    built(&bin_dir()?, name, "cargo build --workspace --bins")
}

/// `dir/name` if that file exists, else an error saying that `build` makes it.
pub fn built(dir: &Path, name: &str, build: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if !path.is_file() {
        bail!("{} not found; build it first: {build}", path.display());
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

    /// The program, arguments, environment and directory (not the user).
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        copy_environment(&mut command, self.envs.iter().map(|(k, v)| (k, v.as_ref())));
        if let Some(dir) = &self.dir {
            command.current_dir(dir);
        }
        command
    }
}

/// Sets (or, for `None`, removes) each variable of `envs` in `command`.
fn copy_environment<K: AsRef<OsStr>, V: AsRef<OsStr>>(
    command: &mut Command,
    envs: impl IntoIterator<Item = (K, Option<V>)>,
) {
    for (key, value) in envs {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
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

fn start(
    name: &str,
    command_line: &CommandLine,
    log: &Path,
    append: bool,
) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = file.try_clone()?;
    let streams = Streams {
        stdin: Stdio::null(),
        stdout: file.into(),
        stderr: err.into(),
    };
    spawn_tied(&command_line.command(), command_line.user, streams)
        .with_context(|| format!("starting {name}"))
}

/// util-linux's `setpriv`, which sets the parent-death signal (on every Debian machine).
pub const SETPRIV_BIN: &str = "setpriv";

/// What a child started by [`spawn_tied`] reads and writes.
#[derive(Debug)]
pub struct Streams {
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

/// Starts `command` (its program, arguments, environment and directory), as `user` if given, so
/// that it ends when this process ends, however this process ends.
///
/// The kernel's parent-death signal (`PR_SET_PDEATHSIG`) is what also covers SIGKILL and crashes,
/// where no code of this process runs to stop its children (a process group killed on drop would
/// not). The workspace forbids `unsafe`, so the child cannot set it itself between fork and exec
/// (`pre_exec`); it runs through `setpriv --pdeathsig KILL`, which sets it and execs the program
/// in its place (the same pid, so signals and waits reach the program). Three details make it
/// hold:
/// - the kernel clears the signal when the child's credentials change, so it must be set after
///   the uid switch: std switches the uid before it execs setpriv, and setpriv sets the signal;
/// - the kernel sends it when the *thread* that forked the child ends, so every child is forked
///   by one thread that lasts as long as this process, never by a test's thread or a runtime's
///   blocking thread, which can end while the child should run;
/// - if this process ended before setpriv set the signal, no signal would ever come: so a shell
///   between setpriv and the program checks that its parent is still this process (a child
///   whose parent ended has been handed to another) and exits instead of running the program.
pub fn spawn_tied(
    command: &Command,
    user: Option<RunAs>,
    streams: Streams,
) -> std::io::Result<Child> {
    let mut tied = tied_to(command, std::process::id());
    if let Some(user) = user {
        // std drops the supplementary groups when it changes the uid.
        use std::os::unix::process::CommandExt;
        tied.uid(user.uid).gid(user.gid);
    }
    tied.stdin(streams.stdin)
        .stdout(streams.stdout)
        .stderr(streams.stderr);
    spawn_from_lasting_thread(tied).map_err(|e| match e.kind() {
        // The program itself is exec'd by the shell, which reports it missing in its output.
        std::io::ErrorKind::NotFound => std::io::Error::new(
            e.kind(),
            format!("{SETPRIV_BIN} (util-linux) not found: {e}"),
        ),
        _ => e,
    })
}

/// The exit status of a child that found its parent gone before it could run the program.
const PARENT_GONE: i32 = 125;

/// `command` run through setpriv and then a shell, to end with the process `parent`. The shell
/// runs once the parent-death signal is set, and runs the program (`$2`, its arguments after
/// it) in its place only while its parent is still `$1`.
fn tied_to(command: &Command, parent: u32) -> Command {
    let parent_check = format!(
        r#"[ "$PPID" = "$1" ] || {{ echo "not started: its parent (pid $1) has ended" >&2; exit {PARENT_GONE}; }}; shift; exec "$@""#
    );
    let mut tied = Command::new(SETPRIV_BIN);
    tied.args(["--pdeathsig", "KILL", "--", "sh", "-c", &parent_check, "sh"])
        .arg(parent.to_string())
        .arg(command.get_program())
        .args(command.get_args());
    copy_environment(&mut tied, command.get_envs());
    if let Some(dir) = command.get_current_dir() {
        tied.current_dir(dir);
    }
    tied
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` from a thread started once and never ended, so that the parent-death signal
/// of [`spawn_tied`] comes when this process ends, not when the calling thread does.
fn spawn_from_lasting_thread(command: Command) -> std::io::Result<Child> {
    static SPAWNER: std::sync::OnceLock<mpsc::Sender<SpawnRequest>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot start, `incoming` is dropped with it and every send below fails.
        let _ = std::thread::Builder::new()
            .name("child-spawner".to_owned())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            });
        requests
    });
    let not_running =
        || std::io::Error::other("the thread that starts child processes is not running");
    let (reply, answer) = mpsc::channel();
    spawner.send((command, reply)).map_err(|_| not_running())?;
    answer.recv().map_err(|_| not_running())?
}

impl Process {
    /// Starts `command`, sending stdout and stderr to a log file named after `name`. It ends
    /// when this process ends ([`spawn_tied`]).
    pub fn spawn(name: &str, command: &Command, log_dir: &Path) -> anyhow::Result<Self> {
        Self::spawn_as(name, command, log_dir, None)
    }

    /// [`Process::spawn`], running as `user` if given (and again as `user` on restart). The log
    /// file is opened by this process, so the user need not be able to write the log directory.
    pub fn spawn_as(
        name: &str,
        command: &Command,
        log_dir: &Path,
        user: Option<RunAs>,
    ) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let command_line = CommandLine::of(command, user);
        let child = start(name, &command_line, &log, false)?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
            command_line,
        })
    }

    /// Starts the process again with the same program, arguments, environment and log file
    /// (appended to), after killing it if it still runs: a crashed service coming back as its
    /// supervisor would restart it. The caller waits for it to serve again.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.child = start(&self.name, &self.command_line, &self.log, true)?;
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
        self.wait_for(what, timeout, || ready().then_some(()))
    }

    /// Waits until `ready` gives a value, failing early if the process dies and after
    /// `timeout`, each time with the process's log.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            // Dead first: a port this process failed to bind may be served by someone else.
            self.check_running()?;
            if let Some(value) = ready() {
                return Ok(value);
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

    /// Waits until a whole line of the process's output gives `find` a value (an address the
    /// process announces, say), as [`Process::wait_for`]. A line still being written is not
    /// looked at: its first half could parse as something else.
    pub fn wait_for_line<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut find: impl FnMut(&str) -> Option<T>,
    ) -> anyhow::Result<T> {
        let log = self.log.clone();
        self.wait_for(what, timeout, || {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let whole = said.rfind('\n').map_or("", |end| &said[..end]);
            whole.lines().find_map(&mut find)
        })
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

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    /// The kernel sends the parent-death signal when the forking *thread* ends: a child started
    /// from a thread that ends at once (a test's, a runtime's blocking thread) must keep running.
    #[test]
    fn a_child_outlives_the_thread_that_started_it() {
        let logs = tempfile::tempdir().unwrap();
        let dir = logs.path().to_owned();
        let mut process = std::thread::spawn(move || {
            Process::spawn("sleeper", &sh("echo started; exec sleep 30"), &dir).unwrap()
        })
        .join()
        .unwrap();
        process
            .wait_for_line("started", Duration::from_secs(10), |l| {
                (l == "started").then_some(())
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        process.check_running().unwrap();
    }

    /// The program runs in the place of setpriv and the shell: the pid is the program's, and its
    /// environment and directory are the command's.
    #[test]
    fn a_tied_child_is_the_program_itself_with_its_environment() {
        let logs = tempfile::tempdir().unwrap();
        let mut command = sh("echo \"$$ $MARK $(pwd)\"; exec sleep 30");
        command.env("MARK", "marked").current_dir("/");
        let mut process = Process::spawn("self", &command, logs.path()).unwrap();
        let said = process
            .wait_for_line("its pid", Duration::from_secs(10), |l| Some(l.to_owned()))
            .unwrap();
        assert_eq!(said, format!("{} marked /", process.id()));
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", process.id())).unwrap();
        assert_eq!(comm.trim(), "sleep");
    }

    /// A child whose parent ended before setpriv set its parent-death signal never gets one:
    /// it must find out itself and not run the program.
    #[test]
    fn a_child_whose_parent_has_ended_does_not_run_the_program() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let program = sh(&format!("touch {}", marker.display()));
        // Pid 1 is never this test's parent: as if the parent had ended and pid 1 adopted it.
        let output = tied_to(&program, 1).output().unwrap();
        assert_eq!(output.status.code(), Some(PARENT_GONE), "{output:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("its parent (pid 1) has ended"),
            "{output:?}"
        );
        assert!(!marker.exists());
        // With the right parent it runs.
        let output = tied_to(&program, std::process::id()).output().unwrap();
        assert!(output.status.success(), "{output:?}");
        assert!(marker.exists());
    }

    /// An announcement printed well after the process started (as local-cluster prints its
    /// admin endpoint once every service is up) is waited for; half a line is not read.
    #[test]
    fn a_line_written_late_is_waited_for_whole() {
        let logs = tempfile::tempdir().unwrap();
        let mut process = Process::spawn(
            "late",
            &sh("sleep 0.5; printf 'admin on 127.0.0.1:4'; sleep 0.5; echo 321; exec sleep 30"),
            logs.path(),
        )
        .unwrap();
        let addr: SocketAddr = process
            .wait_for_line("the admin endpoint", Duration::from_secs(10), |l| {
                l.strip_prefix("admin on ")?.parse().ok()
            })
            .unwrap();
        assert_eq!(addr.port(), 4321);
    }

    /// A wait ends at its deadline, or when the process exits, with what the process said.
    #[test]
    fn a_wait_fails_at_its_deadline_or_the_exit_with_the_log() {
        let logs = tempfile::tempdir().unwrap();
        let mut silent = Process::spawn(
            "silent",
            &sh("echo something else; exec sleep 30"),
            logs.path(),
        )
        .unwrap();
        let started = Instant::now();
        let error = silent
            .wait_for_line("the announcement", Duration::from_millis(300), |l| {
                l.strip_prefix("announced ").map(ToOwned::to_owned)
            })
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        let text = format!("{error:#}");
        assert!(
            text.contains("not ready (the announcement) after 300ms"),
            "{text}"
        );
        assert!(text.contains("something else"), "{text}");

        let mut failing =
            Process::spawn("failing", &sh("echo cannot bind; exit 3"), logs.path()).unwrap();
        let error = failing
            .wait_for_line("the announcement", Duration::from_secs(30), |l| {
                l.strip_prefix("announced ").map(ToOwned::to_owned)
            })
            .unwrap_err();
        let text = format!("{error:#}");
        assert!(text.contains("failing exited"), "{text}");
        assert!(text.contains("cannot bind"), "{text}");
    }

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
