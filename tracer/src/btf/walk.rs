//! Walks kernel BTF: finds a struct member by name (through anonymous structs and unions and
//! nested paths), checks that it still has the shape a probe reads, places bit fields in a
//! 32-bit window, and reads what a function returns. It knows no kernel field; the table of
//! those is the parent module's.

use std::fmt;

use super::raw::{Btf, Composite, Malformed, Type};
use tracer_common::BitField;

/// Why one field could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    #[error("BTF has no struct {0}")]
    NoType(String),
    #[error("struct {root} has no {path}")]
    NoField { root: String, path: String },
    #[error("struct {root} field {path} is {found}, expected {expected}")]
    WrongShape {
        root: String,
        path: String,
        found: String,
        expected: String,
    },
    #[error("struct {root} field {path}: the {count} BTF definitions of struct {root} disagree")]
    Ambiguous {
        root: String,
        path: String,
        count: usize,
    },
    #[error("{0}, and {1}")]
    Neither(Box<Unresolved>, Box<Unresolved>),
    #[error("BTF is inconsistent: {0}")]
    Corrupt(String),
}

/// BTF describes no pointer size; every kernel the eBPF side runs on has 64-bit pointers and
/// the probes read them as `u64`.
const POINTER_BYTES: u32 = 8;

/// What the probe reads at a field, checked so a field that changed type is not misread.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// A pointer to the named struct.
    Ptr(&'static str),
    /// A pointer to pointers to the named struct (a per-CPU array such as `tg->cfs_rq`).
    PtrPtr(&'static str),
    /// An integer (or enum) of this many bytes, not a bit field.
    Int(u32),
    /// Any type of this many bytes (e.g. `char comm[16]`).
    Bytes(u32),
    /// A union of this many bytes, whatever its members.
    Union(u32),
    /// An embedded struct of this name.
    Struct(&'static str),
    /// A pointer to a function.
    FuncPtr,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Ptr(s) => write!(f, "a pointer to struct {s}"),
            Shape::PtrPtr(s) => write!(f, "a pointer to pointers to struct {s}"),
            Shape::Int(n) => write!(f, "a {n}-byte integer"),
            Shape::Bytes(n) => write!(f, "{n} bytes"),
            Shape::Union(n) => write!(f, "a union of {n} bytes"),
            Shape::Struct(s) => write!(f, "struct {s}"),
            Shape::FuncPtr => write!(f, "a function pointer"),
        }
    }
}

/// A member found by name, with its position from the start of the root struct.
#[derive(Debug, Clone)]
struct Found {
    bit_offset: u32,
    /// 0 when the member is not a bit field.
    bitfield_bits: u32,
    type_id: u32,
}

/// What a function returns, as far as a probe cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Returns {
    Void,
    Bool,
    /// Neither: a description of the type.
    Other(String),
}

impl From<Malformed> for Unresolved {
    fn from(e: Malformed) -> Self {
        Unresolved::Corrupt(e.to_string())
    }
}

/// One parsed BTF file.
pub struct Kernel<'a> {
    btf: Btf<'a>,
}

impl<'a> Kernel<'a> {
    pub fn new(btf: Btf<'a>) -> Self {
        Self { btf }
    }

    /// Byte offset of `root.path…` checked against `shape`.
    pub fn offset(&self, root: &str, path: &[&str], shape: Shape) -> Result<u32, Unresolved> {
        let found = self.path(root, path)?;
        let wrong = |found: String| Unresolved::WrongShape {
            root: root.to_string(),
            path: path.join("."),
            found,
            expected: shape.to_string(),
        };
        if found.bitfield_bits != 0 {
            return Err(wrong(format!("a {}-bit bit field", found.bitfield_bits)));
        }
        if found.bit_offset % 8 != 0 {
            return Err(wrong(format!("at bit {}", found.bit_offset)));
        }
        let ty = self.strip(found.type_id)?;
        let ok = match (&shape, &ty) {
            (Shape::Ptr(want), Type::Ptr(target)) => self.points_to_struct(*target, want)?,
            (Shape::PtrPtr(want), Type::Ptr(target)) => match self.strip(*target)? {
                Type::Ptr(inner) => self.points_to_struct(inner, want)?,
                _ => false,
            },
            (Shape::Int(n), Type::Int { .. } | Type::Enum { .. } | Type::Enum64 { .. }) => {
                self.size(found.type_id)? == Some(*n)
            }
            (Shape::Bytes(n), _) => self.size(found.type_id)? == Some(*n),
            (Shape::Union(n), Type::Union(_)) => self.size(found.type_id)? == Some(*n),
            (Shape::Struct(want), Type::Struct(s)) => s.name == *want,
            (Shape::FuncPtr, Type::Ptr(target)) => {
                matches!(self.strip(*target)?, Type::FuncProto { .. })
            }
            _ => false,
        };
        if !ok {
            return Err(wrong(self.describe(found.type_id)?));
        }
        Ok(found.bit_offset / 8)
    }

    /// Whether a pointer to `target` points to `struct want`.
    fn points_to_struct(&self, target: u32, want: &str) -> Result<bool, Unresolved> {
        Ok(match self.strip(target)? {
            Type::Struct(s) => s.name == want,
            _ => false,
        })
    }

    /// The 32-bit window a flag read as "non-zero" is in: an integer or enum of at most 32
    /// bits, or a bit field of one.
    pub fn flag(&self, root: &str, path: &[&str]) -> Result<BitField, Unresolved> {
        let found = self.path(root, path)?;
        let ty = self.strip(found.type_id)?;
        let wrong = |found: String| Unresolved::WrongShape {
            root: root.to_string(),
            path: path.join("."),
            found,
            expected: "an integer of at most 32 bits".to_string(),
        };
        if !matches!(ty, Type::Int { .. } | Type::Enum { .. }) {
            return Err(wrong(self.describe(found.type_id)?));
        }
        let bits = match found.bitfield_bits {
            0 => match self.size(found.type_id)? {
                Some(bytes) => bytes * 8,
                None => return Err(wrong(self.describe(found.type_id)?)),
            },
            bits => bits,
        };
        let root_size = self.root_size(root)?;
        bit_window(found.bit_offset, bits, root_size).ok_or_else(|| {
            wrong(format!(
                "{bits} bits at bit {} that no 32-bit read inside the struct covers",
                found.bit_offset
            ))
        })
    }

    /// Whether BTF has a `FUNC` record named `name`.
    pub fn has_func(&self, name: &str) -> bool {
        !self.funcs(name).is_empty()
    }

    /// What each `FUNC` record named `name` returns (none when BTF has no such record).
    pub fn returns(&self, name: &str) -> Vec<Result<Returns, Unresolved>> {
        self.funcs(name)
            .iter()
            .map(|&func| self.return_of(name, func))
            .collect()
    }

    /// `func` is the FUNC_PROTO of the function `name`.
    fn return_of(&self, name: &str, func: u32) -> Result<Returns, Unresolved> {
        let Type::FuncProto { returns } = self.btf.get(func)? else {
            return Err(Unresolved::Corrupt(format!(
                "FUNC {name} does not point to a FUNC_PROTO"
            )));
        };
        if returns == 0 {
            return Ok(Returns::Void);
        }
        Ok(match self.strip(returns)? {
            Type::Int { name, is_bool, .. } if is_bool || matches!(name, "_Bool" | "bool") => {
                Returns::Bool
            }
            _ => Returns::Other(self.describe(returns)?),
        })
    }

    /// The FUNC_PROTO of every `FUNC` record named `name`.
    fn funcs(&self, name: &str) -> Vec<u32> {
        self.btf
            .named(name)
            .filter_map(|id| match self.btf.get(id) {
                Ok(Type::Func(proto)) => Some(proto),
                _ => None,
            })
            .collect()
    }

    /// Every full definition (not forward declaration) of `struct name`.
    fn structs(&self, name: &str) -> Result<Vec<Composite<'_>>, Unresolved> {
        let structs: Vec<Composite<'_>> = self
            .btf
            .named(name)
            .filter_map(|id| match self.btf.get(id) {
                Ok(Type::Struct(s)) => Some(s),
                _ => None,
            })
            .collect();
        if structs.is_empty() {
            return Err(Unresolved::NoType(name.to_string()));
        }
        Ok(structs)
    }

    fn root_size(&self, root: &str) -> Result<u32, Unresolved> {
        let sizes: Vec<u32> = self.structs(root)?.iter().map(|s| s.size).collect();
        match sizes.as_slice() {
            [first, rest @ ..] if rest.iter().all(|s| s == first) => Ok(*first),
            _ => Err(Unresolved::Ambiguous {
                root: root.to_string(),
                path: String::new(),
                count: sizes.len(),
            }),
        }
    }

    /// Finds `root.path…` in every definition of `struct root`; all that have it must agree,
    /// since a deduplicated vmlinux BTF normally has one and two different layouts under one
    /// name leave no way to know which the probed object uses.
    fn path(&self, root: &str, path: &[&str]) -> Result<Found, Unresolved> {
        let mut results: Vec<Found> = Vec::new();
        let structs = self.structs(root)?;
        for s in &structs {
            if let Some(found) = self.descend(s, path)? {
                let differs = results.first().is_some_and(|first| {
                    first.bit_offset != found.bit_offset
                        || first.bitfield_bits != found.bitfield_bits
                        || self.describe(first.type_id).ok() != self.describe(found.type_id).ok()
                });
                if differs {
                    return Err(Unresolved::Ambiguous {
                        root: root.to_string(),
                        path: path.join("."),
                        count: structs.len(),
                    });
                }
                results.push(found);
            }
        }
        results
            .into_iter()
            .next()
            .ok_or_else(|| Unresolved::NoField {
                root: root.to_string(),
                path: path.join("."),
            })
    }

    /// Follows `path` through embedded structs/unions, adding offsets.
    fn descend(&self, s: &Composite<'_>, path: &[&str]) -> Result<Option<Found>, Unresolved> {
        let Some((first, rest)) = path.split_first() else {
            return Ok(None);
        };
        let Some(found) = self.member(s, first)? else {
            return Ok(None);
        };
        if rest.is_empty() {
            return Ok(Some(found));
        }
        if found.bitfield_bits != 0 {
            return Ok(None);
        }
        let inner = match self.strip(found.type_id)? {
            Type::Struct(inner) | Type::Union(inner) => inner,
            _ => return Ok(None),
        };
        Ok(self.descend(&inner, rest)?.map(|deeper| Found {
            bit_offset: found.bit_offset + deeper.bit_offset,
            ..deeper
        }))
    }

    /// A member named `name` of `s`, also inside its anonymous structs and unions (C puts
    /// their members in the enclosing scope, so a name appears at most once).
    fn member(&self, s: &Composite<'_>, name: &str) -> Result<Option<Found>, Unresolved> {
        for m in s.members() {
            let m = m?;
            if m.name == name {
                return Ok(Some(Found {
                    bit_offset: m.bit_offset,
                    bitfield_bits: m.bitfield_bits,
                    type_id: m.type_id,
                }));
            }
            if m.name.is_empty()
                && let Type::Struct(inner) | Type::Union(inner) = self.strip(m.type_id)?
                && let Some(found) = self.member(&inner, name)?
            {
                return Ok(Some(Found {
                    bit_offset: m.bit_offset + found.bit_offset,
                    ..found
                }));
            }
        }
        Ok(None)
    }

    /// The type behind typedefs and qualifiers (const, volatile, restrict, type tags).
    fn strip(&self, mut id: u32) -> Result<Type<'_>, Unresolved> {
        // A bound, so a malformed cycle cannot hang the agent.
        for _ in 0..64 {
            match self.btf.get(id)? {
                Type::Typedef(next) | Type::Qualified(next) => id = next,
                ty => return Ok(ty),
            }
        }
        Err(Unresolved::Corrupt(format!("type {id}: chain too long")))
    }

    /// Size in bytes, or None for types without one (void, functions).
    fn size(&self, id: u32) -> Result<Option<u32>, Unresolved> {
        Ok(match self.strip(id)? {
            Type::Int { size, .. }
            | Type::Enum { size }
            | Type::Enum64 { size }
            | Type::Float { size } => Some(size),
            Type::Struct(t) | Type::Union(t) => Some(t.size),
            Type::Ptr(_) => Some(POINTER_BYTES),
            Type::Array { elem, len } => self.size(elem)?.and_then(|e| len.checked_mul(e)),
            _ => None,
        })
    }

    /// A short human description of a type, for error messages.
    fn describe(&self, id: u32) -> Result<String, Unresolved> {
        let ty = self.strip(id)?;
        Ok(match &ty {
            Type::Ptr(target) => format!("a pointer to {}", self.describe(*target)?),
            Type::Struct(s) => format!("struct {}", s.name),
            Type::Union(u) => format!("union {}", u.name),
            Type::Int { name, size, .. } => format!("{name} ({size} bytes)"),
            other => match self.size(id)? {
                Some(n) => format!("a {} of {n} bytes", other.kind()),
                None => format!("a {}", other.kind()),
            },
        })
    }
}

/// The 32-bit window that holds `bits` bits starting `bit_offset` bits into a struct of
/// `struct_size` bytes: prefer a 4-byte-aligned window (one aligned load), else start at the
/// field's first byte. None when no window inside the struct holds the whole field.
fn bit_window(bit_offset: u32, bits: u32, struct_size: u32) -> Option<BitField> {
    if bits == 0 || bits > 32 {
        return None;
    }
    let fits = |start_byte: u32| {
        let rel = bit_offset - start_byte * 8;
        (rel + bits <= 32 && start_byte.checked_add(4)? <= struct_size).then_some(rel)
    };
    let aligned = bit_offset / 32 * 4;
    let (start, rel) = match fits(aligned) {
        Some(rel) => (aligned, rel),
        None => {
            let byte = bit_offset / 8;
            (byte, fits(byte)?)
        }
    };
    // BTF counts bits from the first byte's least significant bit on little-endian machines
    // and from its most significant bit on big-endian ones; the agent runs on the kernel's
    // machine, so its own byte order is the kernel's.
    let shift = if cfg!(target_endian = "big") {
        32 - rel - bits
    } else {
        rel
    };
    Some(BitField {
        offset: start,
        shift,
        bits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btf::tests::VMLINUX;
    use std::path::Path;

    /// Writes `value` into `mem` the way the compiler lays out a bit field at `bit_offset`
    /// (little-endian bit numbering, as BTF describes it on x86-64 and arm64).
    fn store_bits(mem: &mut [u8], bit_offset: u32, bits: u32, value: u64) {
        for i in 0..bits {
            let bit = bit_offset + i;
            let byte = (bit / 8) as usize;
            let mask = 1u8 << (bit % 8);
            if value >> i & 1 == 1 {
                mem[byte] |= mask;
            } else {
                mem[byte] &= !mask;
            }
        }
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn window_extracts_int_and_bit_fields() {
        // (bit offset, width, value): a plain int, 1-bit flags at several positions (the
        // 6.18 layout has `throttled` at 3328 and a neighbour at 3329), a field that would
        // straddle an aligned window, and a bool-sized int.
        let cases = [
            (3328, 32, 0xdead_beef_u64),
            (3328, 32, 1),
            (3328, 1, 1),
            (3329, 1, 1),
            (3335, 1, 1),
            (3336, 1, 1),
            (3359, 1, 1),
            (3358, 4, 0b1011),
            (3357, 20, 0xabcde),
            (3336, 8, 0x5a),
        ];
        for (bit_offset, bits, value) in cases {
            // Surround the field with ones so a wrong shift or mask shows up.
            let mut mem = vec![0xffu8; 512];
            store_bits(&mut mem, bit_offset, bits, value);
            let w = bit_window(bit_offset, bits, 512).expect("a window exists");
            assert!(w.offset * 8 <= bit_offset, "window starts after the field");
            assert!(w.shift + w.bits <= 32);
            let at = w.offset as usize;
            let window = u32::from_le_bytes(mem[at..at + 4].try_into().unwrap());
            assert_eq!(
                u64::from(w.extract(window)),
                value,
                "field at bit {bit_offset}, {bits} bits: window {w:?}"
            );
            // And zero reads as zero with all neighbours set.
            store_bits(&mut mem, bit_offset, bits, 0);
            let window = u32::from_le_bytes(mem[at..at + 4].try_into().unwrap());
            assert_eq!(w.extract(window), 0, "zeroed field at {bit_offset}: {w:?}");
        }
    }

    #[test]
    fn window_positions() {
        // 6.18 `bool throttled:1` at bit 3328: byte 416, bit 0.
        let w = bit_window(3328, 1, 512).unwrap();
        assert_eq!((w.offset, w.bits), (416, 1));
        // An aligned window is preferred even when the field starts mid-word.
        let w = bit_window(3329 + 8, 1, 512).unwrap();
        assert_eq!(w.offset, 416);
        // A field crossing an aligned 32-bit boundary falls back to its first byte.
        let w = bit_window(3358, 4, 512).unwrap();
        assert_eq!(w.offset, 3358 / 8);
        // A plain int: the whole window, shift 0.
        let w = bit_window(100 * 8, 32, 512).unwrap();
        assert_eq!((w.offset, w.bits), (100, 32));
        if cfg!(target_endian = "little") {
            assert_eq!(w.shift, 0);
        }
        // No window: too wide, or would read past the struct.
        assert_eq!(bit_window(0, 33, 512), None);
        assert_eq!(bit_window(0, 0, 512), None);
        assert_eq!(bit_window(509 * 8, 8, 510), None);
        assert_eq!(bit_window(3357, 29, 512), None);
    }

    /// 6.18 has no `h_nr_running` (renamed in 6.14): resolving it must fail, not fall back.
    #[test]
    fn host_has_no_h_nr_running() {
        if !Path::new(VMLINUX).exists() {
            crate::testing::missing(&format!("{VMLINUX} is absent"));
            return;
        }
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if !release.starts_with("6.18.") {
            crate::testing::not_applicable("not a 6.18 kernel");
            return;
        }
        let bytes = std::fs::read(VMLINUX).unwrap();
        let k = Kernel::new(Btf::parse(&bytes).unwrap());
        assert_eq!(
            k.offset("cfs_rq", &["h_nr_running"], Shape::Int(4)),
            Err(Unresolved::NoField {
                root: "cfs_rq".into(),
                path: "h_nr_running".into()
            })
        );
        assert!(k.offset("cfs_rq", &["h_nr_queued"], Shape::Int(4)).is_ok());
        // Shape checks bite: `rq` is a pointer, not an int; `curr` sits in an anonymous union.
        assert!(matches!(
            k.offset("cfs_rq", &["rq"], Shape::Int(8)),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(matches!(
            k.offset("cfs_rq", &["throttled"], Shape::Int(4)),
            Err(Unresolved::WrongShape { .. })
        ));
        assert!(k.offset("rq", &["curr"], Shape::Ptr("task_struct")).is_ok());
        assert_eq!(
            k.offset("no_such_struct_here", &["x"], Shape::Int(4)),
            Err(Unresolved::NoType("no_such_struct_here".into()))
        );
    }
}
