//! The GGUF container (llama.cpp's `gguf.md`, versions 2 and 3): header, metadata key/values,
//! tensor infos, then the aligned tensor data. Every length and offset is bounds-checked
//! against the file before it is used, so a truncated or corrupt file is refused naming the
//! file and the key or tensor being read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{ModelError, Result};
use crate::quant::ggml::GgmlType;

/// One metadata value.
#[derive(Clone, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

/// As derived, but a long string or array is cut (with its length), so a message quoting a
/// value (a token list given where a number belongs) stays a line.
impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const CHARS: usize = 64;
        const ENTRIES: usize = 8;
        match self {
            Value::U64(n) => write!(f, "U64({n})"),
            Value::I64(n) => write!(f, "I64({n})"),
            Value::F64(x) => write!(f, "F64({x:?})"),
            Value::Bool(b) => write!(f, "Bool({b})"),
            Value::Str(s) if s.chars().count() > CHARS => {
                let head: String = s.chars().take(CHARS).collect();
                write!(f, "Str({head:?}… ({} bytes))", s.len())
            }
            Value::Str(s) => write!(f, "Str({s:?})"),
            Value::Array(a) if a.len() > ENTRIES => {
                write!(f, "Array({:?}… ({} entries))", &a[..ENTRIES], a.len())
            }
            Value::Array(a) => write!(f, "Array({a:?})"),
        }
    }
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(n) => Some(n),
            Value::I64(n) if n >= 0 => Some(n as u64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(x) => Some(x),
            Value::U64(n) => Some(n as f64),
            Value::I64(n) => Some(n as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A tensor's header: its name, ggml type, dimensions in ggml order (`ne[0]` is the fastest,
/// the row length) and byte range in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    pub ne: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

impl TensorInfo {
    /// The shape in row-major (PyTorch) order: `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().copied().collect()
    }

    pub fn elements(&self) -> usize {
        self.ne.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub map: Arc<Mmap>,
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
}

const MAGIC: &[u8; 4] = b"GGUF";
/// Bounds on counts and string lengths, far above any real file, so a corrupt header cannot
/// make the parser allocate without limit.
const MAX_COUNT: u64 = 1 << 24;
const MAX_STRING: u64 = 1 << 26;
const MAX_DIMS: u32 = 4;

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
    /// What is being read (for messages): a key or tensor name.
    what: String,
}

impl<'a> Cursor<'a> {
    fn err(&self, message: String) -> ModelError {
        ModelError::Gguf {
            path: self.path.to_owned(),
            message: format!("{} (at byte {}): {message}", self.what, self.at),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        match self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
        {
            Some(end) => {
                let out = &self.bytes[self.at..end];
                self.at = end;
                Ok(out)
            }
            None => Err(self.err(format!(
                "needs {n} more bytes but the file ends at {}: truncated",
                self.bytes.len()
            ))),
        }
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn count(&mut self, what: &str) -> Result<usize> {
        let n = self.u64()?;
        if n > MAX_COUNT {
            return Err(self.err(format!("{what} {n} is beyond what a GGUF file holds")));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(self.err(format!(
                "a string of {n} bytes is beyond what a GGUF file holds"
            )));
        }
        let bytes = self.take(n as usize)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err("a string is not UTF-8".into()))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::U64(self.u8()? as u64),
            1 => Value::I64(self.u8()? as i8 as i64),
            2 => Value::U64(self.u16()? as u64),
            3 => Value::I64(self.u16()? as i16 as i64),
            4 => Value::U64(self.u32()? as u64),
            5 => Value::I64(self.u32()? as i32 as i64),
            6 => Value::F64(f32::from_bits(self.u32()?) as f64),
            7 => match self.u8()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("bool value {b}: expected 0 or 1"))),
            },
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.err("nested arrays are not supported".into()));
                }
                let inner = self.u32()?;
                let n = self.count("array length")?;
                let mut out = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    out.push(self.value(inner, depth + 1)?);
                }
                Value::Array(out)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            other => {
                return Err(self.err(format!("metadata value type {other} is not a GGUF type")))
            }
        })
    }
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let io_err = |error| ModelError::Io {
            path: path.to_owned(),
            error,
        };
        let file = crate::fs::open_regular(path).map_err(io_err)?;
        // SAFETY: the file is opened read-only and spindle never writes through the map (as
        // for safetensors checkpoints).
        let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io_err)?);
        let mut c = Cursor {
            bytes: &map[..],
            at: 0,
            path,
            what: "the header".into(),
        };
        if c.take(4)? != MAGIC {
            return Err(c.err("does not start with the GGUF magic: not a GGUF file".into()));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(c.err(format!(
                "GGUF version {version}: spindle reads versions 2 and 3"
            )));
        }
        let n_tensors = c.count("tensor count")?;
        let n_kv = c.count("metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv.min(1 << 12));
        for i in 0..n_kv {
            c.what = format!("metadata entry {i}");
            let key = c.string()?;
            c.what = format!("metadata key `{key}`");
            let ty = c.u32()?;
            let value = c.value(ty, 0)?;
            metadata.push((key, value));
        }
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        for i in 0..n_tensors {
            c.what = format!("tensor info {i}");
            let name = c.string()?;
            c.what = format!("tensor `{name}`");
            let n_dims = c.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(format!("{n_dims} dimensions: expected 1 to {MAX_DIMS}")));
            }
            let mut ne = Vec::new();
            for _ in 0..n_dims {
                let d = c.u64()?;
                if d == 0 || d > 1 << 40 {
                    return Err(c.err(format!("dimension {d} is out of range")));
                }
                ne.push(d as usize);
            }
            let ty_id = c.u32()?;
            let offset = c.u64()?;
            raw.push((name, ne, ty_id, offset));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => 32,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 16 => a as usize,
                _ => {
                    return Err(ModelError::Gguf {
                        path: path.to_owned(),
                        message: format!(
                            "metadata key `general.alignment` = {v:?}: expected a power of two"
                        ),
                    })
                }
            },
        };
        let data_start = c.at.next_multiple_of(alignment);
        // llama.cpp's reader requires each tensor's data to start where the previous one's
        // ends, aligned; a type or shape that disagrees with the data is caught here.
        let mut expected_offset = 0usize;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, ne, ty_id, offset) in raw {
            let bad = |message: String| ModelError::Gguf {
                path: path.to_owned(),
                message: format!("tensor `{name}`: {message}"),
            };
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
                bad(format!(
                    "ggml type {ty_id} ({}) is not supported; spindle reads {}",
                    GgmlType::name_of(ty_id),
                    GgmlType::SUPPORTED
                ))
            })?;
            if ne[0] % ty.block_elements() != 0 {
                return Err(bad(format!(
                    "rows of {} elements are not whole {} blocks of {}",
                    ne[0],
                    ty.name(),
                    ty.block_elements()
                )));
            }
            let bytes = ne
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .and_then(|elements| (elements / ty.block_elements()).checked_mul(ty.block_bytes()))
                .ok_or_else(|| {
                    bad(format!(
                        "dimensions {ne:?} of {} hold more bytes than any file",
                        ty.name()
                    ))
                })?;
            if offset != expected_offset as u64 {
                return Err(bad(format!(
                    "data offset {offset}, expected {expected_offset} (where the previous \
                     tensor's data ends, aligned to {alignment}): a type or shape disagrees \
                     with the data, or the file is corrupt"
                )));
            }
            let start = data_start + expected_offset;
            let end = start.checked_add(bytes).filter(|&e| e <= map.len()).ok_or_else(|| {
                bad(format!(
                    "its {bytes} bytes at offset {start} run past the end of the file ({} bytes): truncated",
                    map.len()
                ))
            })?;
            expected_offset = (end - data_start).next_multiple_of(alignment);
            tensors.push(TensorInfo {
                name,
                ty,
                ne,
                start,
                end,
            });
        }
        // Writers pad the last tensor's data to the alignment and stop; bytes beyond mean a
        // tensor's type or shape claims less data than was written.
        let data_end = data_start + expected_offset;
        if let Some(last) = tensors.last().filter(|_| map.len() > data_end) {
            return Err(ModelError::Gguf {
                path: path.to_owned(),
                message: format!(
                    "{} bytes follow the data of the last tensor `{}` (which ends at {}): a type or shape disagrees with the data, or the file is corrupt",
                    map.len() - data_end,
                    last.name,
                    last.end
                ),
            });
        }
        Ok(GgufFile {
            path: path.to_owned(),
            map,
            version,
            metadata,
            tensors,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The raw bytes of tensor `t`.
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.start..t.end]
    }
}
