//! Test-only: writes small BTF blobs shaped like older kernels (5.4's `int throttled`, `union
//! kernfs_node_id` and `void throttle_cfs_rq`, pre-6.14 `h_nr_running`, no burst), which the
//! host's 6.18 BTF cannot exercise. The encoding follows the kernel's Documentation/bpf/btf.rst.

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const INT_SIGNED: u32 = 1;
const INT_BOOL: u32 = 4;

/// A struct or union member: name, type id, bit offset, bit-field width (0 = not one).
pub type Member<'a> = (&'a str, u32, u32, u32);

#[derive(Default)]
pub struct Builder {
    /// Encoded types by id - 1 (id 0 is void); `None` until defined.
    types: Vec<Option<Vec<u8>>>,
    strings: Vec<u8>,
}

fn push(out: &mut Vec<u8>, words: &[u32]) {
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

fn info(kind: u32, vlen: u32, kind_flag: bool) -> u32 {
    (u32::from(kind_flag) << 31) | (kind << 24) | vlen
}

impl Builder {
    pub fn new() -> Self {
        Self {
            types: Vec::new(),
            strings: vec![0],
        }
    }

    fn str(&mut self, s: &str) -> u32 {
        if s.is_empty() {
            return 0;
        }
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        off
    }

    /// An id to refer to before its type is defined (pointers to structs, cycles).
    pub fn reserve(&mut self) -> u32 {
        self.types.push(None);
        self.types.len() as u32
    }

    fn define(&mut self, id: u32, bytes: Vec<u8>) -> u32 {
        self.types[id as usize - 1] = Some(bytes);
        id
    }

    fn add(&mut self, bytes: Vec<u8>) -> u32 {
        let id = self.reserve();
        self.define(id, bytes)
    }

    pub fn int(&mut self, name: &str, bytes: u32, signed: bool) -> u32 {
        let name = self.str(name);
        let mut t = Vec::new();
        push(&mut t, &[name, info(KIND_INT, 0, false), bytes]);
        let encoding = if signed { INT_SIGNED } else { 0 };
        push(&mut t, &[(encoding << 24) | (bytes * 8)]);
        self.add(t)
    }

    pub fn bool(&mut self) -> u32 {
        let name = self.str("_Bool");
        let mut t = Vec::new();
        push(
            &mut t,
            &[name, info(KIND_INT, 0, false), 1, (INT_BOOL << 24) | 8],
        );
        self.add(t)
    }

    pub fn ptr(&mut self, target: u32) -> u32 {
        let mut t = Vec::new();
        push(&mut t, &[0, info(KIND_PTR, 0, false), target]);
        self.add(t)
    }

    pub fn typedef(&mut self, name: &str, target: u32) -> u32 {
        let name = self.str(name);
        let mut t = Vec::new();
        push(&mut t, &[name, info(KIND_TYPEDEF, 0, false), target]);
        self.add(t)
    }

    pub fn array(&mut self, elem: u32, index: u32, len: u32) -> u32 {
        let mut t = Vec::new();
        push(
            &mut t,
            &[0, info(KIND_ARRAY, 0, false), 0, elem, index, len],
        );
        self.add(t)
    }

    fn aggregate(&mut self, kind: u32, id: u32, name: &str, size: u32, members: &[Member]) -> u32 {
        let name = self.str(name);
        let kind_flag = members.iter().any(|m| m.3 != 0);
        let mut t = Vec::new();
        push(
            &mut t,
            &[name, info(kind, members.len() as u32, kind_flag), size],
        );
        for &(m_name, ty, bit_offset, bits) in members {
            let m_name = self.str(m_name);
            let offset = if kind_flag {
                (bits << 24) | bit_offset
            } else {
                bit_offset
            };
            push(&mut t, &[m_name, ty, offset]);
        }
        self.define(id, t)
    }

    /// Defines `struct name` at an id from [`Builder::reserve`].
    pub fn structure(&mut self, id: u32, name: &str, size: u32, members: &[Member]) -> u32 {
        self.aggregate(KIND_STRUCT, id, name, size, members)
    }

    pub fn union(&mut self, name: &str, size: u32, members: &[Member]) -> u32 {
        let id = self.reserve();
        self.aggregate(KIND_UNION, id, name, size, members)
    }

    /// A static function `name` returning `ret` (0 = void) and taking one pointer.
    pub fn func(&mut self, name: &str, ret: u32, param: u32) -> u32 {
        let mut proto = Vec::new();
        let p_name = self.str("cfs_rq");
        push(
            &mut proto,
            &[0, info(KIND_FUNC_PROTO, 1, false), ret, p_name, param],
        );
        let proto = self.add(proto);
        let name = self.str(name);
        let mut f = Vec::new();
        push(&mut f, &[name, info(KIND_FUNC, 0, false), proto]);
        self.add(f)
    }

    pub fn finish(self) -> Vec<u8> {
        let types: Vec<u8> = self
            .types
            .into_iter()
            .map(|t| t.expect("every reserved type defined"))
            .collect::<Vec<_>>()
            .concat();
        let mut out = Vec::new();
        out.extend_from_slice(&0xeb9f_u16.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        push(
            &mut out,
            &[
                24,
                0,
                types.len() as u32,
                types.len() as u32,
                self.strings.len() as u32,
            ],
        );
        out.extend_from_slice(&types);
        out.extend_from_slice(&self.strings);
        out
    }
}

/// How a synthetic kernel differs from the full 5.4-like one.
#[derive(Clone, Copy)]
pub struct Variant {
    /// 6.18-style `bool throttled:1` at this bit instead of `int throttled` at byte 36.
    pub throttled_bitfield_at: Option<u32>,
    pub with_burst: bool,
    pub with_cgroup_kn: bool,
    /// `cfs_rq.rq` as an `unsigned long` rather than a pointer (a shape change).
    pub rq_as_integer: bool,
    pub with_task_se: bool,
    pub throttle: Throttle,
    /// `task_group.{cfs_rq,children,siblings}` present.
    pub with_children: bool,
    /// `cfs_rq.nr_queued` (6.14+) instead of `cfs_rq.nr_running`.
    pub nr_queued: bool,
    /// 7.x: `task_group.cfs_rq` is one per-CPU `struct cfs_rq *`, not a pointer array.
    pub percpu_cfs_rq: bool,
    /// What the per-period demand reads: `sched_entity.sum_exec_runtime`, the pool and period
    /// timer of `cfs_bandwidth` (then at byte 96 of `task_group`), and the entities: the array
    /// `task_group.se`, or with `percpu_cfs_rq` 7.x's `struct cfs_tg_state`.
    pub with_demand: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Throttle {
    Void,
    Bool,
    Absent,
}

/// 5.4-like by default: `int throttled`, `h_nr_running`, `union kernfs_node_id`, void
/// `throttle_cfs_rq`, no `burst`. Offsets are arbitrary but fixed; the tests name them.
pub const V5_4: Variant = Variant {
    throttled_bitfield_at: None,
    with_burst: false,
    with_cgroup_kn: true,
    rq_as_integer: false,
    with_task_se: true,
    throttle: Throttle::Void,
    with_children: true,
    nr_queued: false,
    percpu_cfs_rq: false,
    with_demand: false,
};

pub fn kernel(v: Variant) -> Vec<u8> {
    let mut b = Builder::new();
    let int = b.int("int", 4, true);
    let uint = b.int("unsigned int", 4, false);
    let u64_ = b.int("long long unsigned int", 8, false);
    let s64 = b.int("long long int", 8, true);
    let ulong = b.int("long unsigned int", 8, false);
    let char_ = b.int("char", 1, true);
    let bool_ = b.bool();
    let bool_t = b.typedef("bool", bool_);
    let u64_t = b.typedef("u64", u64_);
    let u32_t = b.typedef("u32", uint);
    let ktime = b.typedef("ktime_t", s64);
    let pid_t = b.typedef("pid_t", int);
    let comm = b.array(char_, int, 16);

    let cfs_rq = b.reserve();
    let rq = b.reserve();
    let task_group = b.reserve();
    let css = b.reserve();
    let cfs_bandwidth = b.reserve();
    let cgroup = b.reserve();
    let kernfs_node = b.reserve();
    let task_struct = b.reserve();
    let sched_entity = b.reserve();
    let p_rq = b.ptr(rq);
    let p_tg = b.ptr(task_group);
    let p_cgroup = b.ptr(cgroup);
    let p_kn = b.ptr(kernfs_node);
    let p_task = b.ptr(task_struct);
    let p_se = b.ptr(sched_entity);
    let p_cfs_rq = b.ptr(cfs_rq);
    let pp_cfs_rq = b.ptr(p_cfs_rq);
    let pp_se = b.ptr(p_se);
    let list_head = b.reserve();
    let p_list_head = b.ptr(list_head);
    b.structure(
        list_head,
        "list_head",
        16,
        &[("next", p_list_head, 0, 0), ("prev", p_list_head, 64, 0)],
    );

    // The runqueue's tree of queued entities, as every kernel since 4.14 has it.
    let rb_node = b.reserve();
    let p_rb_node = b.ptr(rb_node);
    b.structure(
        rb_node,
        "rb_node",
        24,
        &[
            ("__rb_parent_color", ulong, 0, 0),
            ("rb_right", p_rb_node, 8 * 8, 0),
            ("rb_left", p_rb_node, 16 * 8, 0),
        ],
    );
    let rb_root = b.reserve();
    b.structure(rb_root, "rb_root", 8, &[("rb_node", p_rb_node, 0, 0)]);
    let rb_root_cached = b.reserve();
    b.structure(
        rb_root_cached,
        "rb_root_cached",
        16,
        &[
            ("rb_root", rb_root, 0, 0),
            ("rb_leftmost", p_rb_node, 8 * 8, 0),
        ],
    );

    let throttled = match v.throttled_bitfield_at {
        None => ("throttled", int, 36 * 8, 0),
        Some(bit) => ("throttled", bool_t, bit, 1),
    };
    let rq_member = if v.rq_as_integer {
        ("rq", ulong, 8 * 8, 0)
    } else {
        ("rq", p_rq, 8 * 8, 0)
    };
    b.structure(
        cfs_rq,
        "cfs_rq",
        80,
        &[
            (
                if v.nr_queued {
                    "nr_queued"
                } else {
                    "nr_running"
                },
                uint,
                0,
                0,
            ),
            ("h_nr_running", uint, 4 * 8, 0),
            rq_member,
            ("tg", p_tg, 16 * 8, 0),
            ("throttled_clock", u64_t, 24 * 8, 0),
            throttled,
            ("throttle_count", int, 40 * 8, 0),
            ("tasks_timeline", rb_root_cached, 48 * 8, 0),
            ("curr", p_se, 64 * 8, 0),
        ],
    );
    // `curr` inside an anonymous union, as in 6.x's struct rq.
    let rq_anon = b.union("", 8, &[("curr", p_task, 0, 0), ("donor", p_task, 0, 0)]);
    b.structure(
        rq,
        "rq",
        64,
        &[
            ("clock", u64_t, 8 * 8, 0),
            ("cpu", int, 16 * 8, 0),
            ("", rq_anon, 24 * 8, 0),
        ],
    );
    b.structure(
        css,
        "cgroup_subsys_state",
        16,
        &[("cgroup", p_cgroup, 8 * 8, 0)],
    );
    let mut bw = vec![("period", ktime, 8 * 8, 0), ("quota", u64_t, 16 * 8, 0)];
    if v.with_burst {
        bw.push(("burst", u64_t, 24 * 8, 0));
    }
    let hrtimer = b.reserve();
    b.structure(hrtimer, "hrtimer", 16, &[]);
    if v.with_demand {
        bw.extend([
            ("runtime", u64_t, 32 * 8, 0),
            ("period_timer", hrtimer, 40 * 8, 0),
        ]);
    }
    let (bandwidth_size, bandwidth_at) = if v.with_demand { (56, 96) } else { (32, 16) };
    b.structure(cfs_bandwidth, "cfs_bandwidth", bandwidth_size, &bw);
    let mut tg = vec![
        ("css", css, 0, 0),
        ("cfs_bandwidth", cfs_bandwidth, bandwidth_at * 8, 0),
    ];
    if v.with_demand && !v.percpu_cfs_rq {
        tg.push(("se", pp_se, 152 * 8, 0));
    }
    if v.with_children {
        tg.extend([
            (
                "cfs_rq",
                if v.percpu_cfs_rq { p_cfs_rq } else { pp_cfs_rq },
                48 * 8,
                0,
            ),
            ("children", list_head, 56 * 8, 0),
            ("siblings", list_head, 72 * 8, 0),
        ]);
    }
    b.structure(task_group, "task_group", 160, &tg);
    if v.with_demand && v.percpu_cfs_rq {
        let state = b.reserve();
        b.structure(
            state,
            "cfs_tg_state",
            136,
            &[("cfs_rq", cfs_rq, 0, 0), ("se", sched_entity, 80 * 8, 0)],
        );
    }
    let kn_members: &[Member] = if v.with_cgroup_kn {
        &[("kn", p_kn, 16 * 8, 0)]
    } else {
        &[]
    };
    b.structure(cgroup, "cgroup", 32, kn_members);
    let ino_gen = b.reserve();
    b.structure(
        ino_gen,
        "",
        8,
        &[("ino", u32_t, 0, 0), ("generation", u32_t, 32, 0)],
    );
    let kn_id = b.union(
        "kernfs_node_id",
        8,
        &[("", ino_gen, 0, 0), ("id", u64_t, 0, 0)],
    );
    b.structure(kernfs_node, "kernfs_node", 32, &[("id", kn_id, 8 * 8, 0)]);
    let mut task = vec![
        ("pid", pid_t, 4 * 8, 0),
        ("tgid", pid_t, 8 * 8, 0),
        ("comm", comm, 80 * 8, 0),
    ];
    if v.with_task_se {
        task.push(("se", sched_entity, 16 * 8, 0));
    }
    b.structure(task_struct, "task_struct", 96, &task);
    let mut se = vec![
        ("parent", p_se, 0, 0),
        ("cfs_rq", p_cfs_rq, 8 * 8, 0),
        ("run_node", rb_node, 24 * 8, 0),
        ("my_q", p_cfs_rq, 48 * 8, 0),
    ];
    if v.with_demand {
        se.push(("sum_exec_runtime", u64_t, 16 * 8, 0));
    }
    b.structure(sched_entity, "sched_entity", 56, &se);
    match v.throttle {
        Throttle::Void => _ = b.func("throttle_cfs_rq", 0, p_cfs_rq),
        Throttle::Bool => _ = b.func("throttle_cfs_rq", bool_t, p_cfs_rq),
        Throttle::Absent => {}
    }
    b.func("unthrottle_cfs_rq", 0, p_cfs_rq);
    b.finish()
}
