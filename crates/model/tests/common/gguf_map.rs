//! Where each field of a GGUF header lies, so a test can damage one field by name (an
//! independent reading of llama.cpp's `gguf.md`, not spindle's parser).

pub struct Kv {
    pub key: String,
    /// The key's u64 length.
    pub key_len_at: usize,
    pub ty_at: usize,
    pub ty: u32,
    /// The value (for an array: its u32 element type, then its u64 length, then the elements).
    pub value_at: usize,
}

pub struct TensorField {
    pub name: String,
    pub name_len_at: usize,
    pub n_dims_at: usize,
    pub dims_at: Vec<usize>,
    pub dims: Vec<u64>,
    pub ty_at: usize,
    pub offset_at: usize,
}

pub struct GgufMap {
    pub kvs: Vec<Kv>,
    pub tensors: Vec<TensorField>,
    /// The end of the tensor infos (the data follows, aligned).
    pub header_end: usize,
}

pub const N_TENSORS_AT: usize = 8;
pub const N_KV_AT: usize = 16;

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.b[self.at..self.at + 4].try_into().unwrap());
        self.at += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.b[self.at..self.at + 8].try_into().unwrap());
        self.at += 8;
        v
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        let s = String::from_utf8(self.b[self.at..self.at + n].to_vec()).unwrap();
        self.at += n;
        s
    }
    fn skip_value(&mut self, ty: u32) {
        match ty {
            0 | 1 | 7 => self.at += 1,
            2 | 3 => self.at += 2,
            4..=6 => self.at += 4,
            10..=12 => self.at += 8,
            8 => {
                self.string();
            }
            9 => {
                let inner = self.u32();
                for _ in 0..self.u64() {
                    self.skip_value(inner);
                }
            }
            other => panic!("GGUF type {other} in a pristine fixture"),
        }
    }
}

impl GgufMap {
    pub fn of(bytes: &[u8]) -> Self {
        let mut r = Reader { b: bytes, at: 8 };
        let n_tensors = r.u64();
        let n_kv = r.u64();
        let mut kvs = Vec::new();
        for _ in 0..n_kv {
            let key_len_at = r.at;
            let key = r.string();
            let ty_at = r.at;
            let ty = r.u32();
            let value_at = r.at;
            r.skip_value(ty);
            kvs.push(Kv {
                key,
                key_len_at,
                ty_at,
                ty,
                value_at,
            });
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name_len_at = r.at;
            let name = r.string();
            let n_dims_at = r.at;
            let n = r.u32();
            let mut dims_at = Vec::new();
            let mut dims = Vec::new();
            for _ in 0..n {
                dims_at.push(r.at);
                dims.push(r.u64());
            }
            let ty_at = r.at;
            r.u32();
            let offset_at = r.at;
            r.u64();
            tensors.push(TensorField {
                name,
                name_len_at,
                n_dims_at,
                dims_at,
                dims,
                ty_at,
                offset_at,
            });
        }
        GgufMap {
            kvs,
            tensors,
            header_end: r.at,
        }
    }

    pub fn kv(&self, key_suffix: &str) -> &Kv {
        self.kvs
            .iter()
            .find(|kv| kv.key.ends_with(key_suffix))
            .unwrap_or_else(|| panic!("no key ending {key_suffix}"))
    }
}
