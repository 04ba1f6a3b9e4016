//! A small pool of reader threads: misses are read with `pread` off the compute threads, so
//! the reads of a token's experts overlap each other and the work that does not need them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::buf::AlignedBuf;

type Done = Box<dyn FnOnce(std::io::Result<AlignedBuf>) + Send>;

struct Job {
    file: Arc<File>,
    offset: u64,
    buf: AlignedBuf,
    done: Done,
}

pub struct ReadPool {
    sender: Mutex<Option<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl ReadPool {
    /// Starts `threads` readers (at least one).
    pub fn new(threads: usize) -> Self {
        let (sender, receiver) = channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let threads = (0..threads.max(1))
            .map(|i| {
                let receiver = receiver.clone();
                std::thread::Builder::new()
                    .name(format!("spindle-expert-io-{i}"))
                    .spawn(move || reader(&receiver))
                    .expect("the OS can start a reader thread")
            })
            .collect();
        ReadPool {
            sender: Mutex::new(Some(sender)),
            threads,
        }
    }

    /// Reads `buf.len()` bytes of `file` at `offset` into `buf` on a reader thread, then calls
    /// `done` there with the filled buffer or the error.
    pub fn read(&self, file: Arc<File>, offset: u64, buf: AlignedBuf, done: Done) {
        let job = Job {
            file,
            offset,
            buf,
            done,
        };
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Err(e)) = sender.as_ref().map(|s| s.send(job)) {
            // Every reader has exited (only while dropping): read on this thread.
            run(e.0);
        }
    }
}

fn run(job: Job) {
    let Job {
        file,
        offset,
        mut buf,
        done,
    } = job;
    let result = file.read_exact_at(buf.as_mut_slice(), offset).map(|()| buf);
    done(result);
}

fn reader(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let receiver = receiver.lock().unwrap_or_else(|e| e.into_inner());
            receiver.recv()
        };
        match job {
            Ok(job) => run(job),
            Err(_) => return,
        }
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
