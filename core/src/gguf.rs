//! GGUF header reader: metadata key/values and the tensor table, without tensor data.
//!
//! Layout (little-endian, versions 2 and 3): magic `GGUF`, version u32, tensor count u64,
//! metadata count u64, then the metadata key/values, then one info record per tensor; tensor data
//! starts at the next `general.alignment` boundary. Every length read from the file is checked
//! against the bytes left in it before anything is allocated, so a corrupt file fails with
//! [`Error::ModelLoad`] instead of a huge allocation or a panic.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML_MAX_DIMS: ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal but never nested deeply in practice; the bound keeps recursion
/// (and the stack) small whatever the file says.
const MAX_ARRAY_NESTING: usize = 8;
/// Up-front capacity for arrays of strings or arrays; beyond it they grow as elements are read.
const MAX_PREALLOCATED_ELEMENTS: usize = 1 << 16;

/// The tensor types MLX's GGUF loader keeps as they are (F32, F16) or turns into its own
/// quantization (Q4_0, Q4_1, Q8_0). A file of only these loads through MLX, quantized.
pub const SUPPORTED_TENSOR_TYPES: [GgmlType; 5] =
    [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

/// Further types Weft expands to float32 itself (`loading::gguf_dequant`); a file with any of
/// them loads entirely dequantized. (MLX 0.32 reads BF16 into float16, overflowing values
/// above 65504 to infinity, so BF16 goes this way too.)
pub const DEQUANTIZED_TENSOR_TYPES: [GgmlType; 6] =
    [GgmlType::BF16, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// One metadata value. The integer getters on [`GgufHeader`] accept any integer variant.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

/// A metadata array. Elements are stored by type, so memory stays proportional to the bytes
/// read (a `Vec<GgufValue>` would spend 32 bytes on each one-byte element).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of a string array.
    pub fn as_strs(&self) -> Option<Vec<&str>> {
        match self {
            GgufArray::String(v) => Some(v.iter().map(String::as_str).collect()),
            _ => None,
        }
    }

    /// The elements of an integer array, if they all fit in `i64`.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        fn widen<T: Copy + Into<i64>>(v: &[T]) -> Option<Vec<i64>> {
            Some(v.iter().map(|&x| x.into()).collect())
        }
        match self {
            GgufArray::U8(v) => widen(v),
            GgufArray::I8(v) => widen(v),
            GgufArray::U16(v) => widen(v),
            GgufArray::I16(v) => widen(v),
            GgufArray::U32(v) => widen(v),
            GgufArray::I32(v) => widen(v),
            GgufArray::I64(v) => Some(v.clone()),
            GgufArray::U64(v) => v.iter().map(|&x| i64::try_from(x).ok()).collect(),
            _ => None,
        }
    }

    /// The elements of a numeric array as `f64`.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        match self {
            GgufArray::F32(v) => Some(v.iter().map(|&x| x.into()).collect()),
            GgufArray::F64(v) => Some(v.clone()),
            GgufArray::U64(v) => Some(v.iter().map(|&x| x as f64).collect()),
            _ => Some(self.to_i64s()?.into_iter().map(|x| x as f64).collect()),
        }
    }
}

impl GgufValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// Any float or integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// A ggml tensor type id, as stored in the tensor table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: Self = Self(0);
    pub const F16: Self = Self(1);
    pub const Q4_0: Self = Self(2);
    pub const Q4_1: Self = Self(3);
    pub const Q5_0: Self = Self(6);
    pub const Q5_1: Self = Self(7);
    pub const Q8_0: Self = Self(8);
    pub const Q8_1: Self = Self(9);
    pub const Q2_K: Self = Self(10);
    pub const Q3_K: Self = Self(11);
    pub const Q4_K: Self = Self(12);
    pub const Q5_K: Self = Self(13);
    pub const Q6_K: Self = Self(14);
    pub const Q8_K: Self = Self(15);
    pub const BF16: Self = Self(30);

    /// ggml's name for the type (`ggml_type_name`), or `None` for an id ggml does not define
    /// (4, 5 and 31..33, 36..38 were removed from ggml).
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => return None,
        })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown type id {}", self.0),
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// The raw ggml type id; see [`GgufTensorInfo::ggml_type`] for a typed view.
    pub ggml_type: u32,
    /// Dimensions in ggml order: fastest-varying first (the reverse of the row-major shape).
    pub dims: Vec<u64>,
    /// Byte offset of the tensor's data from [`GgufHeader::data_offset`].
    pub offset: u64,
}

impl GgufTensorInfo {
    pub fn ggml_type(&self) -> GgmlType {
        GgmlType(self.ggml_type)
    }

    /// ggml's name for the tensor's type (`"Q4_K"`), or `"unknown"`.
    pub fn type_name(&self) -> &'static str {
        self.ggml_type().name().unwrap_or("unknown")
    }
}

/// Everything in a GGUF file before the tensor data.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    /// Absolute file offset where tensor data starts (after padding to `general.alignment`).
    pub data_offset: u64,
}

impl GgufHeader {
    /// Parses the header of the GGUF file at `path`, reading only as far as the tensor table ends.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut reader = HeaderReader { inner: BufReader::new(file), pos: 0, file_len, path: path.to_path_buf() };
        reader.read_header()
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// An array of strings; `None` if missing or of any other type.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?.as_array()?.as_strs()
    }

    /// An array of integers (of any integer type) that all fit in `i64`.
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.get(key)?.as_array()?.to_i64s()
    }

    /// An array of numbers (of any numeric type).
    pub fn get_f64_array(&self, key: &str) -> Option<Vec<f64>> {
        self.get(key)?.as_array()?.to_f64s()
    }

    /// `general.architecture`, e.g. `"llama"`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// Fails with [`Error::Unsupported`] naming the first tensor whose type is not one of
    /// [`SUPPORTED_TENSOR_TYPES`].
    pub fn check_supported_tensor_types(&self) -> Result<()> {
        let known = |t: &GgufTensorInfo| {
            SUPPORTED_TENSOR_TYPES.contains(&t.ggml_type()) || DEQUANTIZED_TENSOR_TYPES.contains(&t.ggml_type())
        };
        let Some(tensor) = self.tensors.iter().find(|t| !known(t)) else {
            return Ok(());
        };
        let supported: Vec<String> =
            SUPPORTED_TENSOR_TYPES.iter().chain(&DEQUANTIZED_TENSOR_TYPES).map(ToString::to_string).collect();
        Err(Error::Unsupported(format!(
            "GGUF tensor '{}' has type {}, which Weft does not support (supported: {})",
            tensor.name,
            tensor.ggml_type(),
            supported.join(", ")
        )))
    }
}

/// GGUF metadata value type ids.
mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;

    /// The fewest bytes one value of this type takes, for bounding counts by the file size.
    pub fn min_size(value_type: u32) -> Option<u64> {
        Some(match value_type {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | STRING => 8, // a string is at least its u64 length
            ARRAY => 12,                   // element type u32 + count u64
            _ => return None,
        })
    }
}

struct HeaderReader {
    inner: BufReader<File>,
    pos: u64,
    file_len: u64,
    path: PathBuf,
}

impl HeaderReader {
    fn corrupt(&self, what: impl std::fmt::Display) -> Error {
        Error::ModelLoad(format!("{}: corrupt GGUF header at byte {}: {what}", self.path.display(), self.pos))
    }

    fn remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos)
    }

    fn read_exact<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.fill(&mut buf)?;
        Ok(buf)
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        match self.inner.read_exact(buf) {
            Ok(()) => {
                self.pos += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::ModelLoad(format!(
                "{}: GGUF file is truncated (ended while reading the header at byte {})",
                self.path.display(),
                self.pos
            ))),
            Err(e) => Err(Error::io(&self.path, e)),
        }
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.read_exact::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.read_exact()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.read_exact()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.read_exact()?))
    }

    /// A count of items each at least `min_item_size` bytes long, rejected if the rest of the
    /// file could not hold them.
    fn count(&mut self, what: &str, min_item_size: u64) -> Result<usize> {
        let count = self.u64()?;
        if count.saturating_mul(min_item_size) > self.remaining() {
            return Err(self.corrupt(format!(
                "{what} count {count} cannot fit in the {} bytes left in the file",
                self.remaining()
            )));
        }
        usize::try_from(count).map_err(|_| self.corrupt(format!("{what} count {count} is too large")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.count(&format!("{what} length"), 1)?;
        let mut bytes = vec![0u8; len];
        self.fill(&mut bytes)?;
        String::from_utf8(bytes).map_err(|_| self.corrupt(format!("{what} is not valid UTF-8")))
    }

    fn read_header(&mut self) -> Result<GgufHeader> {
        let magic: [u8; 4] = self.read_exact().map_err(|_| self.not_gguf())?;
        if &magic != MAGIC {
            return Err(self.not_gguf());
        }
        let version = self.u32()?;
        if version != 2 && version != 3 {
            let detail = if matches!(version.swap_bytes(), 2 | 3) {
                "big-endian GGUF files are not supported".to_string()
            } else {
                format!("GGUF version {version} is not supported (Weft reads versions 2 and 3)")
            };
            return Err(Error::Unsupported(format!("{}: {detail}", self.path.display())));
        }
        let tensor_count = self.u64()?;
        // Smallest tensor info: empty name (8) + n_dims (4) + type (4) + offset (8).
        if tensor_count.saturating_mul(24) > self.remaining() {
            return Err(self.corrupt(format!("tensor count {tensor_count} cannot fit in the file")));
        }
        let metadata_count = self.count("metadata", 8 + 4 + 1)?;

        let mut metadata = BTreeMap::new();
        for _ in 0..metadata_count {
            let key = self.string("metadata key")?;
            let value_type = self.u32()?;
            let value = self.value(&key, value_type)?;
            metadata.insert(key, value);
        }

        let tensors = (0..tensor_count).map(|_| self.tensor_info()).collect::<Result<Vec<_>>>()?;

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| *a > 0)
                .ok_or_else(|| self.corrupt(format!("general.alignment must be a positive integer, found {v:?}")))?,
        };
        let data_offset = self.pos.div_ceil(alignment).saturating_mul(alignment);
        Ok(GgufHeader { version, metadata, tensors, data_offset })
    }

    fn not_gguf(&self) -> Error {
        Error::ModelLoad(format!("{} is not a GGUF file (it does not start with 'GGUF')", self.path.display()))
    }

    fn value(&mut self, key: &str, value_type: u32) -> Result<GgufValue> {
        use value_type::*;
        Ok(match value_type {
            U8 => GgufValue::U8(self.u8()?),
            I8 => GgufValue::I8(self.u8()? as i8),
            U16 => GgufValue::U16(self.u16()?),
            I16 => GgufValue::I16(self.u16()? as i16),
            U32 => GgufValue::U32(self.u32()?),
            I32 => GgufValue::I32(self.u32()? as i32),
            U64 => GgufValue::U64(self.u64()?),
            I64 => GgufValue::I64(self.u64()? as i64),
            F32 => GgufValue::F32(f32::from_bits(self.u32()?)),
            F64 => GgufValue::F64(f64::from_bits(self.u64()?)),
            BOOL => GgufValue::Bool(self.bool(key)?),
            STRING => GgufValue::String(self.string(&format!("value of '{key}'"))?),
            ARRAY => GgufValue::Array(self.array(key, 0)?),
            other => return Err(self.corrupt(format!("key '{key}': unknown value type {other}"))),
        })
    }

    fn bool(&mut self, key: &str) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.corrupt(format!("key '{key}': bool byte is {b}, not 0 or 1"))),
        }
    }

    /// An array's element type, count and elements.
    fn array(&mut self, key: &str, depth: usize) -> Result<GgufArray> {
        use value_type::*;
        if depth >= MAX_ARRAY_NESTING {
            return Err(self.corrupt(format!("key '{key}': arrays nested deeper than {MAX_ARRAY_NESTING}")));
        }
        let element_type = self.u32()?;
        let min_size = min_size(element_type)
            .ok_or_else(|| self.corrupt(format!("key '{key}': unknown array element type {element_type}")))?;
        let len = self.count(&format!("key '{key}': array"), min_size)?;
        Ok(match element_type {
            U8 => GgufArray::U8(self.numbers(len, u8::from_le_bytes)?),
            I8 => GgufArray::I8(self.numbers(len, i8::from_le_bytes)?),
            U16 => GgufArray::U16(self.numbers(len, u16::from_le_bytes)?),
            I16 => GgufArray::I16(self.numbers(len, i16::from_le_bytes)?),
            U32 => GgufArray::U32(self.numbers(len, u32::from_le_bytes)?),
            I32 => GgufArray::I32(self.numbers(len, i32::from_le_bytes)?),
            U64 => GgufArray::U64(self.numbers(len, u64::from_le_bytes)?),
            I64 => GgufArray::I64(self.numbers(len, i64::from_le_bytes)?),
            F32 => GgufArray::F32(self.numbers(len, f32::from_le_bytes)?),
            F64 => GgufArray::F64(self.numbers(len, f64::from_le_bytes)?),
            BOOL => GgufArray::Bool(self.elements(len, |r| r.bool(key))?),
            STRING => GgufArray::String(self.elements(len, |r| r.string(&format!("element of '{key}'")))?),
            _ => GgufArray::Array(self.elements(len, |r| r.array(key, depth + 1))?),
        })
    }

    /// `len` fixed-size numbers; `count` has checked that their bytes are in the file.
    fn numbers<T, const N: usize>(&mut self, len: usize, from_le_bytes: fn([u8; N]) -> T) -> Result<Vec<T>> {
        let mut bytes = vec![0u8; len * N];
        self.fill(&mut bytes)?;
        Ok(bytes.chunks_exact(N).map(|chunk| from_le_bytes(chunk.try_into().expect("chunks of N bytes"))).collect())
    }

    /// `len` variable-size elements. The vector grows as elements are actually read, so a
    /// corrupt count cannot reserve more than the file could fill.
    fn elements<T>(&mut self, len: usize, mut read: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut items = Vec::with_capacity(len.min(MAX_PREALLOCATED_ELEMENTS));
        for _ in 0..len {
            items.push(read(self)?);
        }
        Ok(items)
    }

    fn tensor_info(&mut self) -> Result<GgufTensorInfo> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32()?;
        if n_dims > MAX_DIMS {
            return Err(
                self.corrupt(format!("tensor '{name}' has {n_dims} dimensions (ggml allows at most {MAX_DIMS})"))
            );
        }
        let dims = (0..n_dims).map(|_| self.u64()).collect::<Result<Vec<_>>>()?;
        let ggml_type = self.u32()?;
        let offset = self.u64()?;
        Ok(GgufTensorInfo { name, ggml_type, dims, offset })
    }
}
