//! The control calls of the C API (open, close, pin, unpin, map, unmap and the queries), each
//! under the registry's lock: the handle-lifetime protocol of this directory ([`super`]) applied
//! to one call. `capi` checks the C pointers, makes one call here and turns the result into
//! upstream's convention.

#![forbid(unsafe_code)]

use gpudirect_common::Result;

use super::grace::Exit;
use super::parking;
use super::registry::{self, Handle, Tables};
use crate::abi::{GdrInfoV1, MappingType};
use crate::backend::{PinFacts, PinRequest};
use crate::core::{Instance, Leave};
use crate::cpu_mapping::CpuMapping;

/// The C API's disposer for a mapping whose retraction found `exit`: parks a range a copy may
/// still be using, unmaps one that must leave, leaves one the kernel zapped.
fn dispose(exit: Exit) -> impl FnOnce(CpuMapping, Leave) -> Result<()> {
    move |m, leave| match (leave, exit) {
        (Leave::MayStay, Exit::Now) => Ok(()),
        _ => parking::remove(m, exit),
    }
}

/// Hides `h`'s mapping from the copy paths ([`Tables::retract_mapping`]), after unmapping the
/// parked ranges that no copy names any more.
fn retract(t: &Tables, h: &Handle) -> Option<(CpuMapping, MappingType, Exit)> {
    parking::reclaim();
    t.retract_mapping(h)
}

/// `gdr_open`: a new instance, registered; its `gdr_t` value. Opening runs under the control lock
/// too, so every lock the library takes (the dma-buf backend's CUDA state among them) is held
/// only inside it: a fork then never leaves one locked in the child (see `registry`'s
/// `lock_across_fork`).
pub(crate) fn open() -> Result<usize> {
    let mut t = registry::lock();
    Instance::open().and_then(|instance| t.add_instance(instance))
}

/// Unpins one handle: hides its mapping from copies (parking it if one may be under way), then
/// unpins. The handle is forgotten even when the driver reports an error, as the core does with
/// the pin.
fn unpin_one(t: &mut Tables, instance_key: usize, h: Handle) -> Result<()> {
    let exit = retract(t, &h).map_or(Exit::Now, |(_, _, exit)| exit);
    let result = t.instance(instance_key)?.unpin(&h.pin, dispose(exit));
    parking::orphan(h.key());
    t.remove_handle(h);
    result
}

/// `gdr_close`: unpins every handle of `g`, most recent first, then closes the instance.
pub(crate) fn close(g: usize) -> Result<()> {
    let mut t = registry::lock();
    for h in t.handles_of(g)? {
        unpin_one(&mut t, g, h)?;
    }
    parking::reclaim();
    // Dropping the instance closes the gdrdrv file (or releases CUDA).
    drop(t.remove_instance(g)?);
    Ok(())
}

/// `gdr_pin_buffer[_v2]`: pins and registers; the `gdr_mh_t.h` value.
pub(crate) fn pin(g: usize, req: PinRequest) -> Result<usize> {
    let mut t = registry::lock();
    let pin = t.instance(g)?.pin(&req)?;
    match t.add_handle(g, pin.clone()) {
        Ok(h) => Ok(h),
        Err(e) => {
            let _ = t.instance(g)?.unpin(&pin, dispose(Exit::Now));
            Err(e)
        }
    }
}

/// `gdr_unpin_buffer`.
pub(crate) fn unpin(g: usize, h: usize) -> Result<()> {
    let mut t = registry::lock();
    let h = t.handle(g, h)?;
    unpin_one(&mut t, g, h)
}

/// `gdr_map_v2`: maps and shows the mapping to the copy paths; its address. A range parked by
/// this handle's last unmap is taken again if the lengths agree ([`parking::take_for_remap`]).
pub(crate) fn map(g: usize, h: usize, size: usize, flags: i32) -> Result<usize> {
    let t = registry::lock();
    let h = t.handle(g, h)?;
    let key = h.key();
    let mut reuse = parking::take_for_remap(key);
    let mapped = t.instance(g).and_then(|i| i.map(&h.pin, size, flags, &mut reuse));
    if let Some(r) = reuse {
        parking::put_back(key, r);
    }
    let m = mapped?;
    if let Some((m, ty)) = h.pin.mapping() {
        t.publish_mapping(&h, m, ty);
    }
    Ok(m.addr)
}

/// `gdr_unmap`. Copies under way keep a range that is theirs (parked) until they are done; a
/// refused unmap (wrong va or size) puts the mapping back for them.
pub(crate) fn unmap(g: usize, h: usize, va: usize, size: usize) -> Result<()> {
    let t = registry::lock();
    let h = t.handle(g, h)?;
    let instance = t.instance(g)?;
    let published = retract(&t, &h);
    let exit = published.map_or(Exit::Now, |(_, _, exit)| exit);
    let result = instance.unmap(&h.pin, va, size, dispose(exit));
    if let (Err(_), Some((m, ty, _))) = (&result, published) {
        t.publish_mapping(&h, m, ty);
    }
    result
}

/// `gdr_get_callback_flag`.
pub(crate) fn callback_flag(g: usize, h: usize) -> Result<bool> {
    let t = registry::lock();
    let h = t.handle(g, h)?;
    t.instance(g)?.callback_flag(&h.pin)
}

/// `gdr_get_info_v2`.
pub(crate) fn info(g: usize, h: usize) -> Result<PinFacts> {
    let t = registry::lock();
    let h = t.handle(g, h)?;
    t.instance(g)?.info(&h.pin)
}

/// `gdr_get_info`, the 40-byte legacy struct.
pub(crate) fn info_v1(g: usize, h: usize, out: &mut GdrInfoV1) -> Result<()> {
    let t = registry::lock();
    let h = t.handle(g, h)?;
    t.instance(g)?.info_v1(&h.pin, out)
}

/// `gdr_driver_get_version` as (major, minor).
pub(crate) fn driver_version(g: usize) -> Result<(i32, i32)> {
    registry::lock().instance(g)?.driver_version()
}

/// `gdr_get_attribute`.
pub(crate) fn attribute(g: usize, attr: i32) -> Result<i32> {
    registry::lock().instance(g)?.attribute(attr)
}
