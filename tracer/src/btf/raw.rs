//! Reads BTF as the kernel lays it out (Documentation/bpf/btf.rst), only as far as the offsets
//! need. One pass over the type section notes where each type starts and sorts the names of
//! the structs and functions; a type is decoded when it is asked for, borrowing the file's
//! bytes. Decoding every type of a vmlinux into owned values up front (what a general BTF crate
//! does) took ~150 ms and ~40 MB at the agent's start.

use std::fmt;

const MAGIC: u16 = 0xeb9f;
const HEADER_BYTES: usize = 24;
const TYPE_BYTES: usize = 12;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

const INT_BOOL: u32 = 4;

/// Why the bytes are not BTF this reader understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(String);

fn malformed(what: impl Into<String>) -> Malformed {
    Malformed(what.into())
}

/// One BTF blob, indexed.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    big_endian: bool,
    /// Where type `id` starts in `types`, at `id - 1` (id 0 is void).
    starts: Vec<u32>,
    /// (name, id) of every named struct and function, sorted by name.
    named: Vec<(&'a [u8], u32)>,
}

/// A decoded type. Qualifiers and typedefs keep what they refer to; kinds no offset needs are
/// [`Type::Other`].
#[derive(Debug, Clone, Copy)]
pub enum Type<'a> {
    Void,
    Int {
        name: &'a str,
        size: u32,
        is_bool: bool,
    },
    Ptr(u32),
    Array {
        elem: u32,
        len: u32,
    },
    Struct(Composite<'a>),
    Union(Composite<'a>),
    Enum {
        size: u32,
    },
    Enum64 {
        size: u32,
    },
    Float {
        size: u32,
    },
    /// A typedef or a type tag: the type it names.
    Typedef(u32),
    /// const, volatile or restrict: the qualified type.
    Qualified(u32),
    /// A function: its FUNC_PROTO.
    Func(u32),
    /// A function prototype: its return type (0 = void).
    FuncProto {
        returns: u32,
    },
    Other(&'static str),
}

impl Type<'_> {
    /// The kind's name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Type::Void => "void",
            Type::Int { .. } => "int",
            Type::Ptr(_) => "ptr",
            Type::Array { .. } => "array",
            Type::Struct(_) => "struct",
            Type::Union(_) => "union",
            Type::Enum { .. } => "enum",
            Type::Enum64 { .. } => "enum64",
            Type::Float { .. } => "float",
            Type::Typedef(_) => "typedef",
            Type::Qualified(_) => "qualifier",
            Type::Func(_) => "func",
            Type::FuncProto { .. } => "func-proto",
            Type::Other(kind) => kind,
        }
    }
}

/// A struct or union.
#[derive(Clone, Copy)]
pub struct Composite<'a> {
    pub name: &'a str,
    pub size: u32,
    /// Its members' bytes (12 each) and whether their offsets carry bit-field sizes.
    members: &'a [u8],
    bitfields: bool,
    btf: &'a Btf<'a>,
}

impl fmt::Debug for Composite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} bytes)", self.name, self.size)
    }
}

/// A member of a struct or union.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub name: &'a str,
    pub type_id: u32,
    pub bit_offset: u32,
    /// 0 when the member is not a bit field.
    pub bitfield_bits: u32,
}

impl<'a> Composite<'a> {
    pub fn members(&self) -> impl Iterator<Item = Result<Member<'a>, Malformed>> + 'a {
        let (btf, bitfields) = (self.btf, self.bitfields);
        self.members.chunks_exact(TYPE_BYTES).map(move |m| {
            let offset = btf.u32_at(m, 8);
            let (bit_offset, bitfield_bits) = if bitfields {
                (offset & 0x00ff_ffff, offset >> 24)
            } else {
                (offset, 0)
            };
            Ok(Member {
                name: btf.name(btf.u32_at(m, 0))?,
                type_id: btf.u32_at(m, 4),
                bit_offset,
                bitfield_bits,
            })
        })
    }
}

impl<'a> Btf<'a> {
    /// Indexes the BTF in `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Malformed> {
        let magic = bytes
            .get(..2)
            .ok_or_else(|| malformed("shorter than a BTF header"))?;
        let big_endian = match [magic[0], magic[1]] {
            m if u16::from_le_bytes(m) == MAGIC => false,
            m if u16::from_be_bytes(m) == MAGIC => true,
            m => return Err(malformed(format!("bad magic {m:02x?}"))),
        };
        let word = |at: usize| -> Result<usize, Malformed> {
            let b: [u8; 4] = bytes
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| malformed("shorter than a BTF header"))?;
            let w = if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            };
            Ok(w as usize)
        };
        let header = word(4)?.max(HEADER_BYTES);
        let section = |off: usize, len: usize| {
            let start = header + word(off)?;
            bytes
                .get(start..start + word(len)?)
                .ok_or_else(|| malformed("a section runs past the end of the file"))
        };
        let mut btf = Btf {
            types: section(8, 12)?,
            strings: section(16, 20)?,
            big_endian,
            starts: Vec::new(),
            named: Vec::new(),
        };
        btf.index()?;
        Ok(btf)
    }

    fn index(&mut self) -> Result<(), Malformed> {
        let mut at = 0;
        while at < self.types.len() {
            let header = self
                .types
                .get(at..at + TYPE_BYTES)
                .ok_or_else(|| malformed(format!("type {} is cut short", self.starts.len() + 1)))?;
            let info = self.u32_at(header, 4);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                other => return Err(malformed(format!("unknown BTF kind {other}"))),
            };
            let id =
                u32::try_from(self.starts.len() + 1).map_err(|_| malformed("too many types"))?;
            if matches!(kind, KIND_STRUCT | KIND_FUNC) {
                let name = self.name(self.u32_at(header, 0))?;
                if !name.is_empty() {
                    self.named.push((name.as_bytes(), id));
                }
            }
            self.starts
                .push(u32::try_from(at).map_err(|_| malformed("type section too long"))?);
            at += TYPE_BYTES + extra;
        }
        if at != self.types.len() {
            return Err(malformed("the last type runs past the type section"));
        }
        self.named.sort_unstable();
        Ok(())
    }

    fn u32_at(&self, bytes: &[u8], at: usize) -> u32 {
        let b: [u8; 4] = bytes[at..at + 4].try_into().expect("4 bytes");
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    /// The string at `offset` of the string section.
    pub fn name(&self, offset: u32) -> Result<&'a str, Malformed> {
        let strings: &'a [u8] = self.strings;
        let rest = strings
            .get(offset as usize..)
            .ok_or_else(|| malformed(format!("string offset {offset} past the string section")))?;
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| malformed(format!("string at {offset} is not terminated")))?;
        std::str::from_utf8(&rest[..len])
            .map_err(|_| malformed(format!("string at {offset} is not UTF-8")))
    }

    /// The ids of the structs and functions named `name`.
    pub fn named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = u32> + 's {
        let name = name.as_bytes();
        let first = self.named.partition_point(|&(n, _)| n < name);
        self.named[first..]
            .iter()
            .take_while(move |&&(n, _)| n == name)
            .map(|&(_, id)| id)
    }

    /// Type `id`, decoded.
    pub fn get(&'a self, id: u32) -> Result<Type<'a>, Malformed> {
        if id == 0 {
            return Ok(Type::Void);
        }
        let start = *self
            .starts
            .get(id as usize - 1)
            .ok_or_else(|| malformed(format!("no type {id}")))? as usize;
        // Within the section: `index` checked every type's length.
        let t = &self.types[start..];
        let info = self.u32_at(t, 4);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        let size_or_type = self.u32_at(t, 8);
        let name = || self.name(self.u32_at(t, 0));
        Ok(match kind {
            KIND_INT => Type::Int {
                name: name()?,
                size: size_or_type,
                is_bool: (self.u32_at(t, 12) >> 24) & 0x0f & INT_BOOL != 0,
            },
            KIND_PTR => Type::Ptr(size_or_type),
            KIND_ARRAY => Type::Array {
                elem: self.u32_at(t, 12),
                len: self.u32_at(t, 20),
            },
            KIND_STRUCT | KIND_UNION => {
                let composite = Composite {
                    name: name()?,
                    size: size_or_type,
                    members: &t[TYPE_BYTES..TYPE_BYTES + 12 * vlen],
                    bitfields: info >> 31 != 0,
                    btf: self,
                };
                if kind == KIND_STRUCT {
                    Type::Struct(composite)
                } else {
                    Type::Union(composite)
                }
            }
            KIND_ENUM => Type::Enum { size: size_or_type },
            KIND_ENUM64 => Type::Enum64 { size: size_or_type },
            KIND_FLOAT => Type::Float { size: size_or_type },
            KIND_TYPEDEF | KIND_TYPE_TAG => Type::Typedef(size_or_type),
            KIND_VOLATILE | KIND_CONST | KIND_RESTRICT => Type::Qualified(size_or_type),
            KIND_FUNC => Type::Func(size_or_type),
            KIND_FUNC_PROTO => Type::FuncProto {
                returns: size_or_type,
            },
            KIND_FWD => Type::Other("fwd"),
            KIND_VAR => Type::Other("var"),
            KIND_DATASEC => Type::Other("datasec"),
            KIND_DECL_TAG => Type::Other("decl-tag"),
            _ => Type::Other("unknown"),
        })
    }
}
