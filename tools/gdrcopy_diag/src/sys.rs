//! Reading the kernel's view of the machine (/proc, /sys, /dev) and parsing it.
//!
//! Every path goes through [`Sys`], whose root is `/` unless `GDRCOPY_DIAG_SYSROOT` names a
//! directory holding a fake tree (tests). The parsers are plain functions over text.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub struct Sys {
    root: PathBuf,
}

/// What `stat` says about a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub is_char: bool,
    pub mode: u32,
    pub major: u32,
    pub minor: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Sys {
    pub fn from_env() -> Sys {
        let root = std::env::var_os("GDRCOPY_DIAG_SYSROOT").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        Sys { root }
    }

    /// A view of the tree under `root` (tests: fixture sysfs trees).
    #[cfg(test)]
    pub fn with_root(root: &Path) -> Sys {
        Sys { root: root.to_path_buf() }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    pub fn read(&self, p: &str) -> Option<String> {
        std::fs::read_to_string(self.path(p)).ok()
    }

    /// Names in a directory, sorted; empty when it does not exist.
    pub fn list(&self, p: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path(p))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The last component of a symlink's target (e.g. a device's driver name).
    pub fn link_name(&self, p: &str) -> Option<String> {
        let t = std::fs::read_link(self.path(p)).ok()?;
        Some(t.file_name()?.to_string_lossy().into_owned())
    }

    pub fn node(&self, p: &str) -> Option<Node> {
        let m = std::fs::metadata(self.path(p)).ok()?;
        let rdev = m.rdev();
        Some(Node {
            is_char: m.file_type().is_char_device(),
            mode: m.mode() & 0o7777,
            major: libc::major(rdev),
            minor: libc::minor(rdev),
            uid: m.uid(),
            gid: m.gid(),
        })
    }

    /// Whether this process may open `p` for reading and writing (access(2), real ids).
    pub fn can_rw(&self, p: &str) -> bool {
        let Ok(c) = std::ffi::CString::new(self.path(p).as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
        unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) == 0 }
    }

    pub fn exists(&self, p: &str) -> bool {
        Path::exists(&self.path(p))
    }
}

/// The major number registered under `name` in /proc/devices (character devices only).
pub fn proc_devices_major(text: &str, name: &str) -> Option<u32> {
    let chars = text.split("Block devices:").next().unwrap_or("");
    chars.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let major = it.next()?.parse().ok()?;
        (it.next()? == name && it.next().is_none()).then_some(major)
    })
}

/// Who provides kernel symbol `sym` according to /proc/kallsyms: `Some("vmlinux")`, `Some(module)`,
/// or None when no loaded code exports it.
pub fn kallsyms_owner(text: &str, sym: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (_addr, _kind, name) = (it.next()?, it.next()?, it.next()?);
        if name != sym {
            return None;
        }
        Some(it.next().map_or_else(|| "vmlinux".to_owned(), |m| m.trim_matches(|c| c == '[' || c == ']').to_owned()))
    })
}

/// IORESOURCE_MEM and IORESOURCE_PREFETCH from the kernel's ioport.h.
const IORESOURCE_MEM: u64 = 0x200;
const IORESOURCE_PREFETCH: u64 = 0x2000;

/// One line of a PCI device's `resource` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    pub index: usize,
    pub size: u64,
    pub prefetchable: bool,
}

/// The memory BARs in a sysfs `resource` file ("start end flags" per line, hex).
pub fn pci_bars(text: &str) -> Vec<Bar> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    text.lines()
        .enumerate()
        .take(6)
        .filter_map(|(index, l)| {
            let mut it = l.split_whitespace();
            let (start, end, flags) = (hex(it.next()?)?, hex(it.next()?)?, hex(it.next()?)?);
            (flags & IORESOURCE_MEM != 0 && end > start).then_some(Bar {
                index,
                size: end - start + 1,
                prefetchable: flags & IORESOURCE_PREFETCH != 0,
            })
        })
        .collect()
}

/// The BAR through which GPU memory is reached: the largest prefetchable memory BAR (BAR1 on
/// NVIDIA GPUs, BAR2 on the simulated GPU).
pub fn memory_bar(bars: &[Bar]) -> Option<Bar> {
    bars.iter().filter(|b| b.prefetchable).max_by_key(|b| b.size).copied()
}

/// "a.b" of a CUDA version number such as 13000 → "13.0".
pub fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Bytes as the largest whole binary unit that keeps three significant digits.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 { format!("{v:.0} {}", UNITS[u]) } else { format!("{v:.1} {}", UNITS[u]) }
}

/// Fake /sys and /proc trees for unit tests, removed when dropped.
#[cfg(test)]
pub mod fixture {
    use std::path::{Path, PathBuf};

    pub struct Tree(PathBuf);

    impl Tree {
        pub fn new(tag: &str) -> Tree {
            let d = std::env::temp_dir().join(format!("gdrcopy-diag-fixture-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("fixture root");
            Tree(d)
        }
        pub fn root(&self) -> &Path {
            &self.0
        }
        fn at(&self, rel: &str) -> PathBuf {
            self.0.join(rel.trim_start_matches('/'))
        }
        /// A file with `text`, its directories made.
        pub fn file(&self, rel: &str, text: &str) -> &Tree {
            let p = self.at(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
            self
        }
        pub fn dir(&self, rel: &str) -> &Tree {
            std::fs::create_dir_all(self.at(rel)).expect("mkdir");
            self
        }
        /// A symlink at `rel` pointing to `target` (only its last component matters to Sys).
        pub fn link(&self, rel: &str, target: &str) -> &Tree {
            let p = self.at(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::os::unix::fs::symlink(target, p).expect("symlink");
            self
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_devices_takes_character_majors_only() {
        let t = "Character devices:\n  1 mem\n511 gdrdrv\n\nBlock devices:\n 42 gdrdrv\n";
        assert_eq!(proc_devices_major(t, "gdrdrv"), Some(511));
        assert_eq!(proc_devices_major(t, "mem"), Some(1));
        assert_eq!(proc_devices_major("Block devices:\n 7 gdrdrv\n", "gdrdrv"), None);
        assert_eq!(proc_devices_major(t, "gdr"), None);
    }

    #[test]
    fn kallsyms_names_the_exporting_module() {
        let t = "ffffffffc0a01000 T nvidia_p2p_get_pages\t[gpusim]\n0000000000000000 T printk\n";
        assert_eq!(kallsyms_owner(t, "nvidia_p2p_get_pages").as_deref(), Some("gpusim"));
        assert_eq!(kallsyms_owner(t, "printk").as_deref(), Some("vmlinux"));
        assert_eq!(kallsyms_owner(t, "nvidia_p2p_put_pages"), None);
    }

    #[test]
    fn pci_resource_file_gives_the_large_prefetchable_bar() {
        // An H100-like layout: BAR0 16 MiB registers, BAR1 128 GiB prefetchable 64-bit (two
        // lines), BAR3 32 MiB prefetchable, I/O and empty lines.
        let t = "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n\
                 0x0000380000000000 0x0000381fffffffff 0x000000000014220c\n\
                 0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                 0x0000382000000000 0x0000382001ffffff 0x000000000014220c\n\
                 0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                 0x000000000000e000 0x000000000000e07f 0x0000000000040101\n\
                 0x00000000fb000000 0x00000000fb07ffff 0x0000000000046200\n";
        let bars = pci_bars(t);
        assert_eq!(bars.len(), 3, "{bars:?}");
        assert_eq!(memory_bar(&bars), Some(Bar { index: 1, size: 128 << 30, prefetchable: true }));
        assert_eq!(memory_bar(&pci_bars("0x1000 0x1fff 0x40200\n")), None);
    }

    #[test]
    fn version_and_size_words() {
        assert_eq!(cuda_version_string(13000), "13.0");
        assert_eq!(cuda_version_string(13030), "13.3");
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(80 * (1 << 30) + (1 << 29)), "80.5 GiB");
    }
}
