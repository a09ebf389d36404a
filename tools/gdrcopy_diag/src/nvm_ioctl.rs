//! The one ioctl of the libnvm helper module the diag uses: NVM_GET_VERSION
//! (kmod/libnvm/libnvm_ioctl.h, docs/libnvm-module.md). Upstream's module answers it with EINVAL.

use std::os::fd::AsRawFd;
use std::path::Path;

/// `_IOR(0x80, 0x40, struct nvm_ioctl_version)`.
const NVM_GET_VERSION: libc::c_ulong = 0x8010_8040;

#[repr(C)]
#[derive(Default)]
struct NvmIoctlVersion {
    abi_major: u32,
    abi_minor: u32,
    features: u32,
    reserved: u32,
}

/// (abi_major, abi_minor, features) of the module behind `node`, or the errno it answered.
pub fn get_version(node: &Path) -> std::io::Result<(u32, u32, u32)> {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(node)?;
    let mut v = NvmIoctlVersion::default();
    // SAFETY: `f` is an open file for the duration of the call; `v` is a live, writable
    // 16-byte struct with the layout the ioctl's size field (16) names.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), NVM_GET_VERSION, &mut v as *mut NvmIoctlVersion) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((v.abi_major, v.abi_minor, v.features))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_number_encodes_read_type_0x80_nr_0x40_size_16() {
        let (dir_read, size, ty, nr) = (2u64, 16u64, 0x80u64, 0x40u64);
        let n = (dir_read << 30) | (size << 16) | (ty << 8) | nr;
        assert_eq!(n, u64::from(super::NVM_GET_VERSION as u32));
        assert_eq!(std::mem::size_of::<super::NvmIoctlVersion>(), 16);
    }
}
