//! libnvm's status convention: 0 success, a positive errno for a host-side failure, and
//! `-(SCT << 8 | SC)` for an NVMe error status; plus `nvm_strerror`'s texts.

#![forbid(unsafe_code)]

use std::fmt;

use gpudirect_common::Errno;

use crate::abi::NvmCpl;

/// `ETIME`, what libnvm returns when a controller does not answer in time.
pub const ETIME: Errno = Errno(libc::ETIME);

/// An NVMe completion status (SCT/SC; DNR and More are kept for callers, not packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    /// Decodes the 16-bit status field of a completion (phase tag in bit 0).
    pub fn from_field(field: u16) -> Status {
        Status { sct: ((field >> 9) & 0x7) as u8, sc: ((field >> 1) & 0xff) as u8, dnr: field & 0x8000 != 0 }
    }
    pub fn of(cpl: &NvmCpl) -> Status {
        Status::from_field(cpl.status())
    }
    pub fn is_ok(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// `NVM_ERR_STATUS`: `-(SCT << 8 | SC)`.
    pub fn packed(&self) -> i32 {
        -((i32::from(self.sct) << 8) | i32::from(self.sc))
    }
}

/// Every failure of the library: a host errno or an NVMe status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    Os(Errno),
    Nvme(Status),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The packed C value (`NVM_ERR_PACK`).
    pub fn packed(&self) -> i32 {
        match self {
            Error::Os(e) => e.0,
            Error::Nvme(s) => s.packed(),
        }
    }
    /// The errno, if this is a host-side failure.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Os(e) => Some(*e),
            Error::Nvme(_) => None,
        }
    }
}

impl From<Errno> for Error {
    fn from(e: Errno) -> Self {
        Error::Os(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(self.packed()))
    }
}

impl std::error::Error for Error {}

/// Turns a completion into `Ok(cpl)` or its error status.
pub fn check(cpl: NvmCpl) -> Result<NvmCpl> {
    let s = Status::of(&cpl);
    if s.is_ok() { Ok(cpl) } else { Err(Error::Nvme(s)) }
}

const GENERIC: [&str; 0x20] = [
    "Success",
    "Invalid command opcode",
    "Invalid field in command",
    "Command ID conflict",
    "Data transfer error",
    "Commands aborted due to power loss notification",
    "Internal error",
    "Command abort requested",
    "Command aborted due to SQ deletion",
    "Command aborted due to failed fused command",
    "Command aborted due to missing fused command",
    "Invalid namespace or format",
    "Command sequence error",
    "Invalid SGL segment descriptor",
    "Invalid number of SQL descriptors",
    "Data SGL length invalid",
    "Metadata SGL length invalid",
    "SGL descriptor type invalid",
    "Invalid use of controller memory buffer",
    "PRP offset invalid",
    "Atomic write unit exceeded",
    "Operation denied",
    "SGL offset invalid",
    "Unknown/reserved",
    "Host identifier inconsistent format",
    "Keep alive timer expired",
    "Keep alive timer invalid",
    "Command aborted due to preempt and abort",
    "Sanitize failed",
    "Sanitize in progress",
    "SGL data block granularity invalid",
    "Command not supported for queue in CMB",
];

const GENERIC_NVM: [&str; 5] =
    ["LBA out of range", "Capacity exceeded", "Namespace not ready", "Reservation conflict", "Format in progress"];

const SPECIFIC: [&str; 0x23] = [
    "Completion queue invalid",
    "Invalid queue identifier",
    "Invalid queue size",
    "Abort command limit exceeded",
    "Unknown/reserved",
    "Asynchronous event request limit exceeded",
    "Invalid firmware slot",
    "Invalid firmware image",
    "Invalid interrupt vector",
    "Invalid log page",
    "Invalid format",
    "Firmware activation requires conventional reset",
    "Invalid queue deletion",
    "Feature identifier not saveable",
    "Feature not changeable",
    "Feature not namespace specific",
    "Firmware activation requires NVM subsystem reset",
    "Firmware activation requires reset",
    "Firmware activation requires maximum time violation",
    "Firmware activation prohibited",
    "Overlapping range",
    "Namespace insufficient capacity",
    "Namespace identifier unavailable",
    "Unknown/reserved",
    "Namespace already attached",
    "Namespace is private",
    "Namespace not attached",
    "Thin provisioning not supported",
    "Controller list invalid",
    "Device self-test in progress",
    "Boot partition write prohibited",
    "Invalid controller identifier",
    "Invalid secondary controller state",
    "Invalid number of controller resources",
    "Invalid resource identifier",
];

const SPECIFIC_NVM: [&str; 3] =
    ["Conflicting attributes", "Invalid protection information", "Attempted write to read only range"];

const MEDIA: [&str; 8] = [
    "Write fault",
    "Unrecovered read error",
    "End-to-end guard check error",
    "End-to-end application tag check error",
    "End-to-end reference tag check error",
    "Compare failure",
    "Access denied",
    "Deallocated or unwritten logical block",
];

/// The static text `nvm_strerror` gives for an NVMe status, `None` when both parts are 0.
pub fn nvme_text(sct: u8, sc: u8) -> Option<&'static str> {
    if sct == 0 && sc == 0 {
        return None;
    }
    let sc = usize::from(sc);
    Some(match sct {
        0 => match sc {
            0x00..=0x1f => GENERIC[sc],
            0x80..=0x84 => GENERIC_NVM[sc - 0x80],
            _ => "Unknown generic error",
        },
        1 => match sc {
            0x00..=0x22 => SPECIFIC[sc],
            0x80..=0x82 => SPECIFIC_NVM[sc - 0x80],
            _ => "Unknown command specific error",
        },
        2 => match sc {
            0x80..=0x87 => MEDIA[sc - 0x80],
            _ => "Unknown media or data integrity error",
        },
        _ => "Unknown status code type",
    })
}

/// Unpacks a packed status into (errno, SCT, SC) as the `NVM_ERR_UNPACK_*` macros do.
pub fn unpack(status: i32) -> (i32, u8, u8) {
    if status > 0 {
        (status, 0, 0)
    } else if status < 0 {
        let v = status.unsigned_abs();
        (0, ((v >> 8) & 0xff) as u8, (v & 0xff) as u8)
    } else {
        (0, 0, 0)
    }
}

/// `nvm_strerror` as an owned string (the C layer returns static pointers).
pub fn describe(status: i32) -> String {
    let (errno, sct, sc) = unpack(status);
    match nvme_text(sct, sc) {
        Some(t) => t.to_owned(),
        None => Errno(errno).describe(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_matches_the_spec_examples() {
        let cases = [(0u8, 1u8, -1), (0, 2, -2), (0, 0x80, -0x80), (1, 0, -0x100), (1, 1, -0x101), (1, 0x0c, -0x10c)];
        for (sct, sc, want) in cases {
            let field = (u16::from(sct) << 9) | (u16::from(sc) << 1) | 1;
            let s = Status::from_field(field);
            assert_eq!(s.packed(), want);
            assert_eq!(unpack(want), (0, sct, sc));
        }
        assert!(Status::from_field(0x8003).dnr);
        assert_eq!(Status::from_field(0x8005).sc, 2);
        assert_eq!(unpack(22), (22, 0, 0));
    }

    #[test]
    fn texts() {
        assert_eq!(describe(0), "Success");
        assert_eq!(describe(22), "Invalid argument");
        assert_eq!(describe(-1), "Invalid command opcode");
        assert_eq!(describe(-0x80), "LBA out of range");
        assert_eq!(describe(-0x10c), "Invalid queue deletion");
        assert_eq!(describe(-0x122), "Invalid resource identifier");
        assert_eq!(describe(-0x123), "Unknown command specific error");
        assert_eq!(describe(-0x20), "Unknown generic error");
        assert_eq!(describe(-0x287), "Deallocated or unwritten logical block");
        assert_eq!(describe(-0x201), "Unknown media or data integrity error");
        assert_eq!(describe(-0x301), "Unknown status code type");
        assert_eq!(describe(-0xe), "Invalid number of SQL descriptors");
        assert_eq!(describe(-0x1f), "Command not supported for queue in CMB");
    }
}
