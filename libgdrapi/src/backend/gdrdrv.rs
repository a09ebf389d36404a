//! Backend 1: the gdrdrv kernel module behind `/dev/gdrdrv`.

use std::ffi::CString;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use gpudirect_common::{Errno, Result};

use super::gdrdrv_abi::*;
use super::pin::{PinFacts, PinRequest};
use crate::abi::{GDR_API_VERSION, GdrInfoV1, MINIMUM_GDRDRV_VERSION, MappingType, set_info_bits};
use crate::cpu_mapping::{self, CpuMapping, HostPage};

/// The device node upstream's installer creates.
pub const DEVICE_PATH: &str = "/dev/gdrdrv";

/// An open gdrdrv file that passed the version handshake.
#[derive(Debug)]
pub struct Gdrdrv {
    fd: OwnedFd,
    version: u32,
}

impl Gdrdrv {
    /// Opens `path` and checks versions both ways (spec §3.4 / §4.1).
    pub fn open(path: &str) -> Result<Gdrdrv> {
        let c = CString::new(path).map_err(|_| Errno::EINVAL)?;
        // SAFETY: `c` is NUL-terminated; open has no other preconditions.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = Errno::last();
            gdr_err!("error opening driver (errno={}/{})", e.0, e.describe());
            return Err(e);
        }
        // SAFETY: `raw` is a descriptor we just opened and own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut p = GetVersionParams::default();
        if let Err(e) = ioctl(fd.as_fd(), IOC_GET_VERSION, &mut p) {
            gdr_err!(
                "Error getting the gdrdrv driver version with ioctl error (errno={}). gdrdrv might be too old.",
                e.0
            );
            return Err(e);
        }
        if p.gdrdrv_version < MINIMUM_GDRDRV_VERSION {
            gdr_err!(
                "The minimum required gdrdrv driver version is {}.{} but the current gdrdrv version is {}.{}",
                MINIMUM_GDRDRV_VERSION >> 16,
                MINIMUM_GDRDRV_VERSION & 0xffff,
                p.gdrdrv_version >> 16,
                p.gdrdrv_version & 0xffff
            );
            return Err(Errno::EINVAL);
        }
        if p.minimum_gdr_api_version > GDR_API_VERSION {
            gdr_err!(
                "gdrdrv driver requires libgdrapi version {}.{} or above but the current libgdrapi version is {}.{}",
                p.minimum_gdr_api_version >> 16,
                p.minimum_gdr_api_version & 0xffff,
                GDR_API_VERSION >> 16,
                GDR_API_VERSION & 0xffff
            );
            return Err(Errno::EINVAL);
        }
        Ok(Gdrdrv { fd, version: p.gdrdrv_version })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn raw_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    fn call<P: IoctlParams>(&self, cmd: std::ffi::c_ulong, p: &mut P) -> Result<()> {
        ioctl(self.fd.as_fd(), cmd, p).inspect_err(|e| gdr_err!("ioctl error (errno={})", e.0))
    }

    /// Pins; returns the kernel handle. Drivers ≥ 2.5 get PIN_BUFFER_V2 (token and va_space are
    /// then not representable and dropped, as upstream does).
    pub fn pin(&self, req: &PinRequest) -> Result<u64> {
        if self.version >= VERSION_WITH_PIN_BUFFER_V2 {
            let mut p = PinBufferV2Params {
                addr: req.addr,
                size: req.size,
                flags: req.flags & PIN_FLAG_FORCE_PCIE,
                ..Default::default()
            };
            self.call(IOC_PIN_BUFFER_V2, &mut p)?;
            Ok(p.handle)
        } else {
            if req.flags != 0 {
                gdr_err!("gdrdrv is too old to support pin flags (need 2.5 or newer)");
                return Err(Errno::EINVAL);
            }
            let mut p = PinBufferParams {
                addr: req.addr,
                size: req.size,
                p2p_token: req.p2p_token,
                va_space: req.va_space,
                ..Default::default()
            };
            self.call(IOC_PIN_BUFFER, &mut p)?;
            Ok(p.handle)
        }
    }

    pub fn unpin(&self, handle: u64) -> Result<()> {
        self.call(IOC_UNPIN_BUFFER, &mut UnpinBufferParams { handle })
    }

    pub fn callback_flag(&self, handle: u64) -> Result<bool> {
        let mut p = GetCbFlagParams { handle, ..Default::default() };
        self.call(IOC_GET_CB_FLAG, &mut p)?;
        Ok(p.flag != 0)
    }

    /// GET_INFO_V2 on drivers ≥ 2.4, else GET_INFO with the type derived from its two flags.
    pub fn info(&self, handle: u64) -> Result<PinFacts> {
        if self.version >= VERSION_WITH_GET_INFO_V2 {
            let mut p = GetInfoV2Params { handle, ..Default::default() };
            self.call(IOC_GET_INFO_V2, &mut p)?;
            Ok(PinFacts {
                va: p.va,
                mapped_size: p.mapped_size,
                page_size: p.page_size,
                tm_cycles: p.tm_cycles,
                cycles_per_ms: p.tsc_khz,
                mapping_type: MappingType::from_raw(p.mapping_type).unwrap_or(MappingType::None),
            })
        } else {
            let p = self.info_v1_raw(handle)?;
            let mapping_type = match (p.mapped != 0, p.wc_mapping != 0) {
                (false, _) => MappingType::None,
                (true, true) => MappingType::WriteCombined,
                (true, false) => MappingType::Caching,
            };
            Ok(PinFacts {
                va: p.va,
                mapped_size: p.mapped_size,
                page_size: p.page_size,
                tm_cycles: p.tm_cycles,
                cycles_per_ms: p.tsc_khz,
                mapping_type,
            })
        }
    }

    fn info_v1_raw(&self, handle: u64) -> Result<GetInfoParams> {
        let mut p = GetInfoParams { handle, ..Default::default() };
        self.call(IOC_GET_INFO, &mut p)?;
        Ok(p)
    }

    /// The legacy GET_INFO, filling the 40-byte v1 struct (only its own bits of the bit-field unit).
    pub fn info_v1(&self, handle: u64, out: &mut GdrInfoV1) -> Result<()> {
        let p = self.info_v1_raw(handle)?;
        out.va = p.va;
        out.mapped_size = p.mapped_size;
        out.page_size = p.page_size;
        out.tm_cycles = p.tm_cycles;
        out.cycles_per_ms = p.tsc_khz;
        set_info_bits(&mut out.flag_bits, p.mapped != 0, p.wc_mapping != 0);
        Ok(())
    }

    /// GET_ATTR; drivers older than 2.5 answer 0 without an ioctl.
    pub fn attribute(&self, attr: u32) -> Result<u32> {
        if self.version < VERSION_WITH_GET_ATTR {
            return Ok(0);
        }
        let mut p = GetAttrParams { attr, val: 0 };
        self.call(IOC_GET_ATTR, &mut p)?;
        Ok(p.val)
    }

    /// Maps `len` bytes of the pinned buffer `handle`, asking for `requested` first (drivers ≥ 2.5;
    /// `None` resets an earlier request).
    /// Maps a pinned handle (`at`: a parked range to place it on, see [`cpu_mapping::map_shared`]).
    pub fn map(
        &self,
        handle: u64,
        len: usize,
        requested: MappingType,
        page: HostPage,
        at: Option<usize>,
    ) -> Result<CpuMapping> {
        if self.version >= VERSION_WITH_REQ_MAPPING_TYPE {
            let mut p = ReqMappingTypeParams { handle, mapping_type: requested as u32 };
            self.call(IOC_REQ_MAPPING_TYPE, &mut p)?;
        }
        // Upstream keeps only the low 32 bits of the kernel handle; the offset encodes it in pages.
        let offset = u64::from(handle as u32) << page.shift;
        cpu_mapping::map_shared(self.fd.as_fd(), len, offset, at).inspect_err(|e| gdr_err!("error {} in mmap", e.0))
    }

    pub fn driver_version(&self) -> Result<u32> {
        let mut p = GetVersionParams::default();
        self.call(IOC_GET_VERSION, &mut p)?;
        Ok(p.gdrdrv_version)
    }
}
