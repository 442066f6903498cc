//! Reading and diffing cpu.stat and cpu.stat.local.
