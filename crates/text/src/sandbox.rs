//! Rendering chat templates in a child process under a memory and a time budget.
//!
//! minijinja's fuel bounds how many instructions a render runs, not how much memory it takes:
//! `{% set ns.s = ns.s ~ ns.s %}` forty times asks for a terabyte in forty instructions, and
//! minijinja has no hook where a value's size could be checked. So a template from a model
//! directory is rendered in a forked child of this process whose address space may grow by
//! at most [`RENDER_MEMORY_BYTES`] (`RLIMIT_AS`): an allocation past it fails and the child
//! aborts, never this process. The parent waits at most [`RENDER_TIME_LIMIT`] and kills the
//! child when that passes or when the request is cancelled ([`Cancel`]).
//!
//! A worker is forked once and then renders one request after another (the arguments go to
//! it as JSON through a pipe, the text comes back), so an ordinary render costs a pipe round
//! trip, not a fork; a worker that was killed is replaced on the next render. Forking rather
//! than re-executing a binary works the same in the CLI, the server, library users and
//! `cargo test`. The child is a copy of this process with one thread: it closes every
//! descriptor but its two pipes and stderr (so it holds no client socket open), and only
//! renders, reads and writes its pipes until the request pipe closes (its parent dropped it
//! or died) and it `_exit`s.
//!
//! A forked worker shares the pages its parent had at the fork; the parent's later writes to
//! them are copied. [`Workers::prestart`] forks the first worker when the model is loaded,
//! before sessions and request buffers exist, so that little is shared.
//!
//! When `fork` fails the render is refused, never run here without its budget. Elsewhere
//! than Linux the render runs in this process with fuel and the output cap only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map as JsonMap, Value as Json};

use crate::TextError;

/// How much a render worker's address space may grow past what it inherited (512 MiB): far
/// above what a conversation that fills a long context needs (a 4 MB message renders in
/// tens of MB), and little enough that `--parallel` workers fit beside the model.
pub const RENDER_MEMORY_BYTES: u64 = 512 << 20;

/// The wall-clock time one render may take (its fuel runs out after 1-2 s of CPU).
pub const RENDER_TIME_LIMIT: Duration = Duration::from_secs(10);

/// A request's cancellation, shared with the thread rendering for it: once cancelled, the
/// render's child is killed and the render returns [`TextError::Cancelled`].
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// A new token and a guard that cancels it when dropped (hold the guard in the future
    /// that waits for the render: a dropped request cancels its render).
    pub fn with_guard() -> (Cancel, CancelOnDrop) {
        let cancel = Cancel::default();
        let guard = CancelOnDrop(cancel.clone());
        (cancel, guard)
    }
}

/// Cancels its [`Cancel`] when dropped.
#[derive(Debug)]
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// What one render needs besides the template: sent to the worker as JSON.
#[derive(Serialize, Deserialize)]
pub(crate) struct RenderArgs {
    pub name: String,
    pub messages: Json,
    pub tools: Option<Json>,
    pub add_generation_prompt: bool,
    pub extra: JsonMap<String, Json>,
}

/// Idle render workers of one template.
#[derive(Default)]
pub(crate) struct Workers {
    #[cfg(target_os = "linux")]
    idle: Mutex<Vec<linux::Worker>>,
    #[cfg(not(target_os = "linux"))]
    idle: Mutex<Vec<()>>,
}

/// Idle workers kept per template; more run at once when renders overlap.
const MAX_IDLE_WORKERS: usize = 8;

impl Workers {
    /// Starts one idle worker now (see the module docs), unless one is idle already.
    pub(crate) fn prestart(&self, render: &dyn Fn(&RenderArgs) -> Result<String, TextError>) {
        #[cfg(target_os = "linux")]
        {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.is_empty() {
                match linux::Worker::start(render) {
                    Ok(worker) => idle.push(worker),
                    Err(e) => tracing::warn!("cannot fork a chat template worker: {e}"),
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = render;
    }

    /// An idle worker that is still alive (one killed from outside is reaped and skipped).
    #[cfg(target_os = "linux")]
    fn take_idle(&self) -> Option<linux::Worker> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(mut worker) = idle.pop() {
            if worker.is_alive() {
                return Some(worker);
            }
        }
        None
    }

    /// Renders `args` with `render` in a worker (see the module docs); `render` is what the
    /// worker runs, on its copy of the template.
    pub(crate) fn render(
        &self,
        args: &RenderArgs,
        cancel: &Cancel,
        render: &dyn Fn(&RenderArgs) -> Result<String, TextError>,
    ) -> Result<String, TextError> {
        #[cfg(target_os = "linux")]
        {
            let worker = self.take_idle();
            let worker = match worker {
                Some(w) => w,
                // Never rendered here without the budget: no worker, no render.
                None => linux::Worker::start(render).map_err(|e| TextError::TemplateRender {
                    name: args.name.clone(),
                    message: format!("cannot start a render worker (fork: {e})"),
                })?,
            };
            let (result, worker) = worker.render(args, cancel);
            if let Some(worker) = worker {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                if idle.len() < MAX_IDLE_WORKERS {
                    idle.push(worker);
                }
            }
            result
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (&self.idle, cancel);
            render(args)
        }
    }
}

/// A reply's kind, its first byte.
#[repr(u8)]
#[derive(Clone, Copy)]
enum Reply {
    Text = 0,
    Exception = 1,
    Render = 2,
    Budget = 3,
}

/// A render's result as the worker sends it: the kind and its text.
fn encode_reply(result: Result<String, TextError>) -> (Reply, String) {
    match result {
        Ok(text) => (Reply::Text, text),
        Err(TextError::TemplateException { message }) => (Reply::Exception, message),
        Err(TextError::TemplateBudget { budget, .. }) => (Reply::Budget, budget),
        Err(TextError::TemplateRender { message, .. }) => (Reply::Render, message),
        Err(other) => (Reply::Render, other.to_string()),
    }
}

fn decode_reply(kind: u8, text: String, name: &str) -> Result<String, TextError> {
    let name = name.to_string();
    match kind {
        0 => Ok(text),
        1 => Err(TextError::TemplateException { message: text }),
        3 => Err(TextError::TemplateBudget { name, budget: text }),
        _ => Err(TextError::TemplateRender {
            name,
            message: text,
        }),
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::File;
    use std::io::{self, Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::time::Instant;

    use super::*;
    use crate::MAX_RENDERED_BYTES;

    /// A forked render worker: its pid and the parent's ends of its two pipes.
    pub(crate) struct Worker {
        pid: libc::pid_t,
        requests: File,
        replies: File,
    }

    /// Why an exchange with a worker did not bring a reply.
    enum Failure {
        Cancelled,
        TimedOut,
        /// The worker closed its pipe: it exited or was killed.
        Died,
        Io(io::Error),
    }

    impl Worker {
        /// Forks a worker that renders with `render`.
        pub(crate) fn start(
            render: &dyn Fn(&RenderArgs) -> Result<String, TextError>,
        ) -> io::Result<Worker> {
            let (request_read, request_write) = pipe()?;
            let (reply_read, reply_write) = pipe()?;
            // SAFETY: the child runs only `serve` (async-signal-safe calls, plus malloc, which
            // glibc keeps usable after fork) on its copy of this thread's memory and never
            // returns into the caller's frames: it ends in `_exit`.
            match unsafe { libc::fork() } {
                -1 => Err(io::Error::last_os_error()),
                0 => serve(request_read.as_raw_fd(), reply_write.as_raw_fd(), render),
                pid => {
                    drop((request_read, reply_write));
                    set_nonblocking(&request_write)?;
                    set_nonblocking(&reply_read)?;
                    Ok(Worker {
                        pid,
                        requests: File::from(request_write),
                        replies: File::from(reply_read),
                    })
                }
            }
        }

        /// Renders `args` in the worker; gives the worker back when it can render again.
        pub(crate) fn render(
            mut self,
            args: &RenderArgs,
            cancel: &Cancel,
        ) -> (Result<String, TextError>, Option<Worker>) {
            let deadline = Instant::now() + RENDER_TIME_LIMIT;
            let name = args.name.as_str();
            let exchanged = serde_json::to_vec(args)
                .map_err(|e| Failure::Io(io::Error::other(e)))
                .and_then(|request| self.exchange(&request, deadline, cancel));
            let failure = match exchanged {
                Ok((kind, text)) => return (decode_reply(kind, text, name), Some(self)),
                Err(failure) => failure,
            };
            let status = self.kill();
            let error = match failure {
                Failure::Cancelled => TextError::Cancelled,
                Failure::TimedOut => TextError::TemplateBudget {
                    name: name.to_string(),
                    budget: format!("{} s of time", RENDER_TIME_LIMIT.as_secs()),
                },
                Failure::Died if died_of_memory(status) => TextError::TemplateBudget {
                    name: name.to_string(),
                    budget: format!("{} MiB of memory", RENDER_MEMORY_BYTES >> 20),
                },
                Failure::Died => TextError::TemplateRender {
                    name: name.to_string(),
                    message: format!("the render worker died ({})", describe_status(status)),
                },
                Failure::Io(e) => TextError::TemplateRender {
                    name: name.to_string(),
                    message: format!("talking to the render worker failed: {e}"),
                },
            };
            tracing::debug!("chat template render failed in its worker: {error}");
            (Err(error), None)
        }

        /// Sends one request frame and reads the reply's kind and text.
        fn exchange(
            &mut self,
            request: &[u8],
            deadline: Instant,
            cancel: &Cancel,
        ) -> Result<(u8, String), Failure> {
            let mut frame = (request.len() as u64).to_le_bytes().to_vec();
            frame.extend_from_slice(request);
            let mut sent = 0;
            while sent < frame.len() {
                match self.requests.write(&frame[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        wait(&self.requests, libc::POLLOUT, deadline, cancel)?
                    }
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(Failure::Died),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Failure::Io(e)),
                }
            }
            let mut head = [0u8; 9];
            self.read_exact(&mut head, deadline, cancel)?;
            let len = u64::from_le_bytes(head[1..].try_into().unwrap_or([0; 8]));
            if len > (MAX_RENDERED_BYTES as u64) + (1 << 20) {
                return Err(Failure::Io(io::Error::other(format!(
                    "a reply of {len} bytes"
                ))));
            }
            let mut text = vec![0u8; len as usize];
            self.read_exact(&mut text, deadline, cancel)?;
            let text = String::from_utf8(text)
                .map_err(|_| Failure::Io(io::Error::other("a reply that is not UTF-8")))?;
            Ok((head[0], text))
        }

        fn read_exact(
            &mut self,
            buf: &mut [u8],
            deadline: Instant,
            cancel: &Cancel,
        ) -> Result<(), Failure> {
            let mut got = 0;
            while got < buf.len() {
                match self.replies.read(&mut buf[got..]) {
                    Ok(0) => return Err(Failure::Died),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        wait(&self.replies, libc::POLLIN, deadline, cancel)?
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Failure::Io(e)),
                }
            }
            Ok(())
        }

        /// Whether the worker has not exited (reaps it when it has).
        pub(crate) fn is_alive(&mut self) -> bool {
            let mut status = 0;
            // SAFETY: `pid` is our child, not yet reaped; WNOHANG never blocks.
            match unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } {
                0 => true,
                _ => {
                    self.pid = 0;
                    false
                }
            }
        }

        /// Kills the worker and reaps it; its wait status.
        fn kill(&mut self) -> libc::c_int {
            let mut status = 0;
            if self.pid <= 0 {
                return status; // reaped already; kill(0) would signal our whole group
            }
            // SAFETY: `pid` is our child, not yet reaped (`kill` and `is_alive` reap it and
            // then set it to 0); kill and waitpid take plain values and the status pointer.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                while libc::waitpid(self.pid, &mut status, 0) == -1
                    && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                {
                }
            }
            self.pid = 0;
            status
        }
    }

    impl Drop for Worker {
        fn drop(&mut self) {
            if self.pid != 0 {
                self.kill();
            }
        }
    }

    /// Waits until `file` is ready for `events`, the deadline passes or `cancel` is set
    /// (checked every 20 ms).
    fn wait(
        file: &File,
        events: libc::c_short,
        deadline: Instant,
        cancel: &Cancel,
    ) -> Result<(), Failure> {
        loop {
            if cancel.is_cancelled() {
                return Err(Failure::Cancelled);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::TimedOut);
            }
            let mut fd = libc::pollfd {
                fd: file.as_raw_fd(),
                events,
                revents: 0,
            };
            let slice = left.min(Duration::from_millis(20)).as_millis().max(1) as libc::c_int;
            // SAFETY: one valid pollfd, passed with its count.
            let ready = unsafe { libc::poll(&mut fd, 1, slice) };
            if ready > 0 {
                return Ok(());
            }
            if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return Err(Failure::Io(io::Error::last_os_error()));
            }
        }
    }

    /// The worker's life: limit itself, then render requests until its pipe closes.
    fn serve(
        requests: RawFd,
        replies: RawFd,
        render: &dyn Fn(&RenderArgs) -> Result<String, TextError>,
    ) -> ! {
        // No PR_SET_PDEATHSIG: it fires when the forking *thread* ends (a blocking-pool
        // thread may), not the process. The worker ends when its request pipe closes, which
        // happens when the parent drops it or dies (only the parent holds the write end).
        // SAFETY: plain system calls on this process's own descriptors.
        unsafe {
            // Keep the pipes (as 0 and 1) and stderr; close everything else this process
            // inherited (client sockets, the listener, model files).
            if libc::dup2(requests, 0) < 0 || libc::dup2(replies, 1) < 0 {
                libc::_exit(71);
            }
            if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
                for fd in 3..open_files_limit() {
                    libc::close(fd);
                }
            }
        }
        if limit_address_space(RENDER_MEMORY_BYTES).is_err() {
            // SAFETY: _exit ends this child without running the parent's destructors.
            unsafe { libc::_exit(72) };
        }
        // SAFETY: 0 and 1 are the pipes dup'ed above, owned by this process from here on.
        let (mut input, mut output) = unsafe { (File::from_raw_fd(0), File::from_raw_fd(1)) };
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            let mut len = [0u8; 8];
            if input.read_exact(&mut len).is_err() {
                return; // the parent closed the pipe or is gone
            }
            let mut request = vec![0u8; u64::from_le_bytes(len) as usize];
            if input.read_exact(&mut request).is_err() {
                return;
            }
            let result = serde_json::from_slice::<RenderArgs>(&request)
                .map_err(|e| TextError::TemplateRender {
                    name: String::new(),
                    message: format!("bad render request: {e}"),
                })
                .and_then(|args| render(&args));
            drop(request);
            let (kind, text) = encode_reply(result);
            let mut head = vec![kind as u8];
            head.extend_from_slice(&(text.len() as u64).to_le_bytes());
            if output.write_all(&head).is_err() || output.write_all(text.as_bytes()).is_err() {
                return;
            }
        }));
        // SAFETY: as above.
        unsafe { libc::_exit(if served.is_ok() { 0 } else { 70 }) }
    }

    /// Sets `RLIMIT_AS` to what is mapped now plus `budget` bytes.
    fn limit_address_space(budget: u64) -> io::Result<()> {
        let statm = std::fs::read_to_string("/proc/self/statm")?;
        let pages: u64 = statm
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| io::Error::other("unreadable /proc/self/statm"))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let limit = pages.saturating_mul(page).saturating_add(budget);
        let rlimit = libc::rlimit {
            rlim_cur: limit,
            rlim_max: limit,
        };
        // SAFETY: setrlimit reads only the struct passed by pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlimit) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn open_files_limit() -> libc::c_int {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct passed by pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return 1024;
        }
        limit.rlim_cur.min(1 << 20) as libc::c_int
    }

    /// A pipe whose ends close on exec (so no program this process runs inherits them).
    fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array passed.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned by nothing else.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    }

    fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// An allocation that failed under `RLIMIT_AS` aborts the child (Rust's out-of-memory
    /// handler): SIGABRT; the kernel's OOM killer would send SIGKILL.
    fn died_of_memory(status: libc::c_int) -> bool {
        libc::WIFSIGNALED(status) && matches!(libc::WTERMSIG(status), libc::SIGABRT | libc::SIGKILL)
    }

    fn describe_status(status: libc::c_int) -> String {
        if libc::WIFSIGNALED(status) {
            format!("signal {}", libc::WTERMSIG(status))
        } else {
            format!("exit status {}", libc::WEXITSTATUS(status))
        }
    }
}
