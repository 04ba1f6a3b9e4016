//! Streaming safetensors writer: the header is written first from the tensors' shapes, then
//! each tensor's bytes in order, so a checkpoint larger than memory can be written tensor by
//! tensor. Files are written under a temporary name and renamed when complete.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::error::{ModelError, Result};
use crate::layout::SpecDtype;

/// One tensor to be written: its name, element type and shape.
#[derive(Clone, Debug)]
pub struct TensorHeader {
    pub name: String,
    pub dtype: SpecDtype,
    pub shape: Vec<usize>,
}

impl TensorHeader {
    pub fn byte_len(&self) -> usize {
        let size = match self.dtype {
            SpecDtype::Bf16 => 2,
            SpecDtype::F32 => 4,
            SpecDtype::I64 => 8,
        };
        self.shape.iter().product::<usize>() * size
    }
}

fn dtype_name(d: SpecDtype) -> &'static str {
    match d {
        SpecDtype::Bf16 => "BF16",
        SpecDtype::F32 => "F32",
        SpecDtype::I64 => "I64",
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |error| ModelError::Io {
        path: path.to_owned(),
        error,
    }
}

/// Writes one safetensors file; call [`SafetensorsWriter::write_tensor`] for each header in
/// order, then [`SafetensorsWriter::finish`].
pub struct SafetensorsWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    headers: Vec<TensorHeader>,
    next: usize,
}

impl SafetensorsWriter {
    pub fn create(path: &Path, headers: Vec<TensorHeader>) -> Result<Self> {
        let tmp = path.with_extension("safetensors.partial");
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let mut out = BufWriter::with_capacity(1 << 22, file);
        let mut meta = Map::new();
        meta.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut offset = 0usize;
        for h in &headers {
            let len = h.byte_len();
            meta.insert(
                h.name.clone(),
                json!({"dtype": dtype_name(h.dtype), "shape": h.shape, "data_offsets": [offset, offset + len]}),
            );
            offset += len;
        }
        let mut header = Value::Object(meta).to_string().into_bytes();
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
        out.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io_err(&tmp))?;
        out.write_all(&header).map_err(io_err(&tmp))?;
        Ok(SafetensorsWriter {
            path: path.to_owned(),
            tmp,
            out,
            headers,
            next: 0,
        })
    }

    /// Writes the bytes of the next tensor (must be exactly its byte length).
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let h = &self.headers[self.next];
        assert_eq!(bytes.len(), h.byte_len(), "tensor {} byte length", h.name);
        self.out.write_all(bytes).map_err(io_err(&self.tmp))?;
        self.next += 1;
        Ok(())
    }

    /// Writes the next tensor as zeros by leaving a hole in the file: on file systems with
    /// sparse files it takes no disk space (reads return zeros).
    pub fn write_zeros(&mut self) -> Result<()> {
        let len = self.headers[self.next].byte_len() as i64;
        self.out
            .seek(SeekFrom::Current(len))
            .map_err(io_err(&self.tmp))?;
        self.next += 1;
        Ok(())
    }

    /// Writes part of the current tensor; `done` marks its last part.
    pub fn write_part(&mut self, bytes: &[u8], done: bool) -> Result<()> {
        self.out.write_all(bytes).map_err(io_err(&self.tmp))?;
        if done {
            self.next += 1;
        }
        Ok(())
    }

    /// Flushes, syncs and renames the file into place.
    pub fn finish(self) -> Result<()> {
        assert_eq!(
            self.next,
            self.headers.len(),
            "not every tensor was written"
        );
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| io_err(&self.tmp)(e.into_error()))?;
        // A trailing hole (zeros written last) must still count towards the length.
        let end = file.stream_position().map_err(io_err(&self.tmp))?;
        file.set_len(end).map_err(io_err(&self.tmp))?;
        file.sync_all().map_err(io_err(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.path).map_err(io_err(&self.path))?;
        Ok(())
    }
}
