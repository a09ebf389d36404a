//! The controller thread: register state machine, queue processing, command execution.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::mem;
use crate::state::{BAR_SIZE, Shared};

const CAP: usize = 0x00;
const VS: usize = 0x08;
const CC: usize = 0x14;
const CSTS: usize = 0x1c;
const AQA: usize = 0x24;
const ASQ: usize = 0x28;
const ACQ: usize = 0x30;

/// The CPU address of `len` bytes at bus address `bus` (through `Config::translate` when set),
/// or `None` when nothing is there: the command then fails with Data Transfer Error.
fn cpu(s: &Shared, bus: u64, len: usize) -> Option<u64> {
    let a = match &s.cfg.translate {
        Some(t) => (t.0)(bus, len)?,
        None => bus,
    };
    mem::plausible(a, len).then_some(a)
}

fn rd(s: &Shared, off: usize) -> u32 {
    s.bar[off / 4].load(Ordering::SeqCst)
}
fn wr(s: &Shared, off: usize, v: u32) {
    s.bar[off / 4].store(v, Ordering::SeqCst)
}
fn rd64(s: &Shared, off: usize) -> u64 {
    u64::from(rd(s, off)) | (u64::from(rd(s, off + 4)) << 32)
}

pub fn init_registers(s: &Shared) {
    let c = &s.cfg;
    let cap = u64::from(c.mqes)
        | (u64::from(c.cqr) << 16)
        | (u64::from(c.timeout_units) << 24)
        | (u64::from(c.dstrd & 0xf) << 32)
        | (1u64 << 37)
        | (u64::from(c.mpsmin & 0xf) << 48)
        | (u64::from(c.mpsmax & 0xf) << 52);
    wr(s, CAP, cap as u32);
    wr(s, CAP + 4, (cap >> 32) as u32);
    wr(s, VS, 0x0001_0400);
}

/// A completion: (sct, sc, dnr, dword 0).
#[derive(Clone, Copy, Debug)]
struct Outcome {
    sct: u8,
    sc: u8,
    dnr: bool,
    dw0: u32,
}

const OK: Outcome = Outcome { sct: 0, sc: 0, dnr: false, dw0: 0 };
fn err(sct: u8, sc: u8) -> Outcome {
    Outcome { sct, sc, dnr: true, dw0: 0 }
}

struct Sq {
    base: u64,
    size: u32,
    head: u32,
    cqid: u16,
}

struct Cq {
    base: u64,
    size: u32,
    tail: u32,
    phase: bool,
}

struct State {
    enabled: bool,
    ready_at: Option<Instant>,
    page: usize,
    sqs: BTreeMap<u16, Sq>,
    cqs: BTreeMap<u16, Cq>,
    granted: (u16, u16),
    /// Completions waiting for room in their CQ: (cqid, sqid, sqhd, cid, outcome).
    backlog: Vec<(u16, u16, u16, u16, Outcome)>,
}

pub fn run(s: &Shared) {
    let mut st = State {
        enabled: false,
        ready_at: None,
        page: 4096,
        sqs: BTreeMap::new(),
        cqs: BTreeMap::new(),
        granted: (s.cfg.max_ioqpairs, s.cfg.max_ioqpairs),
        backlog: Vec::new(),
    };
    let mut idle = 0u32;
    while !s.stop.load(Ordering::SeqCst) {
        let busy = step(s, &mut st);
        if busy {
            idle = 0;
        } else {
            idle += 1;
            if idle < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(if idle < 4096 { 20 } else { 200 }));
            }
        }
    }
}

fn step(s: &Shared, st: &mut State) -> bool {
    let cc = rd(s, CC);
    let en = cc & 1 != 0;
    if en != st.enabled {
        st.enabled = en;
        if en {
            enable(s, st, cc);
        } else {
            st.sqs.clear();
            st.cqs.clear();
            st.backlog.clear();
            st.ready_at = None;
            st.granted = (s.cfg.max_ioqpairs, s.cfg.max_ioqpairs);
            wr(s, CSTS, 0);
            s.stats.resets.fetch_add(1, Ordering::Relaxed);
        }
        return true;
    }
    if let Some(t) = st.ready_at {
        if Instant::now() >= t {
            st.ready_at = None;
            let cfs = if s.cfg.fatal_on_enable { 2 } else { 0 };
            wr(s, CSTS, 1 | cfs);
        }
        return true;
    }
    if !en || rd(s, CSTS) & 1 == 0 || s.stalled.load(Ordering::SeqCst) {
        return false;
    }
    let mut busy = flush_backlog(s, st);
    let ids: Vec<u16> = st.sqs.keys().copied().collect();
    for id in ids {
        busy |= process_sq(s, st, id);
    }
    busy
}

fn enable(s: &Shared, st: &mut State, cc: u32) {
    st.page = 1usize << (12 + ((cc >> 7) & 0xf));
    let aqa = rd(s, AQA);
    let asqs = (aqa & 0xfff) + 1;
    let acqs = ((aqa >> 16) & 0xfff) + 1;
    st.sqs.insert(0, Sq { base: rd64(s, ASQ), size: asqs, head: 0, cqid: 0 });
    st.cqs.insert(0, Cq { base: rd64(s, ACQ), size: acqs, tail: 0, phase: true });
    if !s.cfg.never_ready {
        st.ready_at = Some(Instant::now() + s.cfg.ready_delay);
    }
}

fn doorbell(s: &Shared, qid: u16, cq: bool) -> usize {
    0x1000 + (2 * usize::from(qid) + usize::from(cq)) * (4usize << s.cfg.dstrd)
}

/// A created queue starts with its doorbell at 0, as on a real controller: a queue deleted and
/// created again must not fetch (or count as consumed) entries of its earlier life.
fn reset_doorbell(s: &Shared, qid: u16, cq: bool) {
    let off = doorbell(s, qid, cq);
    if off + 4 <= BAR_SIZE {
        wr(s, off, 0);
    }
}

fn cq_has_room(s: &Shared, cq: &Cq, cqid: u16) -> bool {
    let off = doorbell(s, cqid, true);
    let head = if off + 4 <= BAR_SIZE { rd(s, off) } else { 0 };
    (cq.tail + 1) % cq.size != head % cq.size
}

fn post(s: &Shared, st: &mut State, cqid: u16, sqid: u16, sqhd: u16, cid: u16, o: Outcome) -> bool {
    let Some(cq) = st.cqs.get_mut(&cqid) else { return true };
    if !cq_has_room(s, cq, cqid) {
        s.stats.cq_full_waits.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let status: u32 =
        (u32::from(o.dnr) << 15) | (u32::from(o.sct & 7) << 9) | (u32::from(o.sc) << 1) | u32::from(cq.phase);
    let Some(addr) = cpu(s, cq.base + 16 * u64::from(cq.tail), 16) else {
        s.stats.lost_completions.fetch_add(1, Ordering::Relaxed);
        return true;
    };
    mem::write_cpl(addr, [o.dw0, 0, u32::from(sqhd) | (u32::from(sqid) << 16), u32::from(cid) | (status << 16)]);
    cq.tail += 1;
    if cq.tail == cq.size {
        cq.tail = 0;
        cq.phase = !cq.phase;
    }
    true
}

fn flush_backlog(s: &Shared, st: &mut State) -> bool {
    if st.backlog.is_empty() {
        return false;
    }
    let pending = std::mem::take(&mut st.backlog);
    let mut progressed = false;
    for (i, (cqid, sqid, sqhd, cid, o)) in pending.iter().copied().enumerate() {
        if post(s, st, cqid, sqid, sqhd, cid, o) {
            progressed = true;
        } else {
            st.backlog.extend_from_slice(&pending[i..]);
            break;
        }
    }
    progressed
}

fn process_sq(s: &Shared, st: &mut State, sqid: u16) -> bool {
    if !st.backlog.is_empty() {
        return false;
    }
    let off = doorbell(s, sqid, false);
    if off + 4 > BAR_SIZE {
        return false;
    }
    let tail = rd(s, off);
    let (size, cqid) = match st.sqs.get(&sqid) {
        Some(q) => (q.size, q.cqid),
        None => return false,
    };
    if tail >= size {
        s.stats.bad_doorbells.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let mut batch = Vec::new();
    while let Some(q) = st.sqs.get_mut(&sqid) {
        if q.head == tail {
            break;
        }
        // An SQ slot that translates to nothing reads as a zeroed command (a Flush with CID 0).
        let cmd = cpu(s, q.base + 64 * u64::from(q.head), 64).map_or([0u32; 16], mem::read_cmd);
        q.head = (q.head + 1) % q.size;
        let sqhd = q.head as u16;
        let cid = (cmd[0] >> 16) as u16;
        let o = execute(s, st, sqid, &cmd);
        batch.push((cqid, sqid, sqhd, cid, o));
        if batch.len() >= 64 {
            break;
        }
    }
    if batch.is_empty() {
        return false;
    }
    if s.out_of_order.load(Ordering::SeqCst) {
        batch.reverse();
    }
    st.backlog = batch;
    flush_backlog(s, st);
    true
}

fn injected(s: &Shared, admin: bool, opcode: u8) -> Option<Outcome> {
    let mut inj = s.injections.lock().unwrap_or_else(|p| p.into_inner());
    let i = inj
        .iter()
        .position(|j| j.count > 0 && j.matches.admin == admin && j.matches.opcode.is_none_or(|o| o == opcode))?;
    inj[i].count -= 1;
    let j = inj[i];
    if j.count == 0 {
        inj.remove(i);
    }
    Some(Outcome { sct: j.sct, sc: j.sc, dnr: j.dnr, dw0: 0 })
}

fn execute(s: &Shared, st: &mut State, sqid: u16, cmd: &[u32; 16]) -> Outcome {
    let opcode = cmd[0] as u8;
    let admin = sqid == 0;
    if admin {
        s.stats.admin_commands.fetch_add(1, Ordering::Relaxed);
    } else {
        s.stats.io_commands.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(o) = injected(s, admin, opcode) {
        return o;
    }
    if (cmd[0] >> 8) & 0x3 != 0 || (cmd[0] >> 14) & 0x3 != 0 {
        // Fused commands and SGLs are not supported.
        return err(0, 0x02);
    }
    if admin { admin_cmd(s, st, cmd) } else { io_cmd(s, st, cmd) }
}

fn prp(cmd: &[u32; 16]) -> (u64, u64) {
    (u64::from(cmd[6]) | (u64::from(cmd[7]) << 32), u64::from(cmd[8]) | (u64::from(cmd[9]) << 32))
}

/// The host memory segments a PRP pair describes for `len` bytes (spec §B5), or an error status.
fn segments(s: &Shared, page: usize, prp1: u64, prp2: u64, len: usize) -> Result<Vec<(u64, usize)>, Outcome> {
    let page64 = page as u64;
    if prp1 & 3 != 0 {
        return Err(err(0, 0x13));
    }
    if cpu(s, prp1, 1).is_none() {
        return Err(err(0, 0x04));
    }
    let first = (page - (prp1 % page64) as usize).min(len);
    let mut segs = vec![(prp1, first)];
    let mut left = len - first;
    if left == 0 {
        return Ok(segs);
    }
    if left <= page {
        if !prp2.is_multiple_of(page64) {
            return Err(err(0, 0x13));
        }
        if cpu(s, prp2, left).is_none() {
            return Err(err(0, 0x04));
        }
        segs.push((prp2, left));
        return Ok(segs);
    }
    // PRP2 is a list pointer (qword aligned, may have an offset); chain through the last entry
    // of each full list page while more entries remain.
    if prp2 & 7 != 0 {
        return Err(err(0, 0x13));
    }
    let mut entry = prp2;
    while left > 0 {
        let Some(entry_cpu) = cpu(s, entry, 8) else {
            return Err(err(0, 0x04));
        };
        let last_in_page = (entry % page64) as usize == page - 8;
        let v = mem::read_u64(entry_cpu);
        if last_in_page && left > page {
            if v & 7 != 0 {
                return Err(err(0, 0x13));
            }
            entry = v;
            continue;
        }
        if !v.is_multiple_of(page64) {
            return Err(err(0, 0x13));
        }
        if cpu(s, v, 1).is_none() {
            return Err(err(0, 0x04));
        }
        let n = left.min(page);
        segs.push((v, n));
        left -= n;
        entry += 8;
    }
    Ok(segs)
}

/// Translates every segment first, so a command either moves all its data or none.
fn translate_all(s: &Shared, segs: Vec<(u64, usize)>) -> Result<Vec<(u64, usize)>, Outcome> {
    segs.into_iter().map(|(a, n)| cpu(s, a, n).map(|c| (c, n)).ok_or(err(0, 0x04))).collect()
}

fn to_host(s: &Shared, page: usize, cmd: &[u32; 16], data: &[u8]) -> Outcome {
    let (p1, p2) = prp(cmd);
    match segments(s, page, p1, p2, data.len()).and_then(|v| translate_all(s, v)) {
        Ok(segs) => {
            let mut off = 0;
            for (a, n) in segs {
                mem::write(a, &data[off..off + n]);
                off += n;
            }
            OK
        }
        Err(o) => o,
    }
}

fn admin_cmd(s: &Shared, st: &mut State, cmd: &[u32; 16]) -> Outcome {
    let c = &s.cfg;
    let opcode = cmd[0] as u8;
    let nsid = cmd[1];
    let qid = cmd[10] as u16;
    let qsize = (cmd[10] >> 16) + 1;
    match opcode {
        0x06 => {
            let cns = cmd[10] & 0xff;
            let mut d = vec![0u8; 4096];
            match cns {
                1 => {
                    d[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
                    d[2..4].copy_from_slice(&0x1af4u16.to_le_bytes());
                    pad(&mut d[4..24], &c.serial);
                    pad(&mut d[24..64], &c.model);
                    pad(&mut d[64..72], &c.firmware);
                    d[77] = c.mdts;
                    d[80..84].copy_from_slice(&0x0001_0400u32.to_le_bytes());
                    d[512] = 0x66;
                    d[513] = 0x44;
                    d[516..520].copy_from_slice(&1u32.to_le_bytes());
                }
                0 => {
                    if nsid == 0 || nsid == 0xffff_ffff {
                        return err(0, 0x0b);
                    }
                    if nsid == 1 {
                        for o in [0usize, 8, 16] {
                            d[o..o + 8].copy_from_slice(&c.n_blocks.to_le_bytes());
                        }
                        d[128 + 2] = c.lba_shift;
                    } else if nsid > 1 {
                        return err(0, 0x0b);
                    }
                }
                _ => return err(0, 0x02),
            }
            to_host(s, st.page, cmd, &d)
        }
        0x09 | 0x0a => {
            if cmd[10] & 0xff != 0x07 {
                return err(0, 0x02);
            }
            if opcode == 0x09 {
                if st.sqs.len() > 1 || st.cqs.len() > 1 {
                    return err(0, 0x0c);
                }
                let nsq = (cmd[11] & 0xffff) as u16;
                let ncq = (cmd[11] >> 16) as u16;
                if nsq == 0xffff || ncq == 0xffff {
                    return err(0, 0x02);
                }
                st.granted = ((ncq + 1).min(c.max_ioqpairs), (nsq + 1).min(c.max_ioqpairs));
            }
            let dw0 = (u32::from(st.granted.0 - 1) << 16) | u32::from(st.granted.1 - 1);
            Outcome { dw0, ..OK }
        }
        0x05 => {
            let (base, _) = prp(cmd);
            if qid == 0 || qid > c.max_ioqpairs || st.cqs.contains_key(&qid) {
                return err(1, 0x01);
            }
            if qsize < 2 || qsize > u32::from(c.mqes) + 1 {
                return err(1, 0x02);
            }
            if cmd[11] & 1 == 0 && c.cqr {
                return err(0, 0x02);
            }
            if cpu(s, base, 16).is_none() || base % st.page as u64 != 0 {
                return err(0, 0x13);
            }
            st.cqs.insert(qid, Cq { base, size: qsize, tail: 0, phase: true });
            reset_doorbell(s, qid, true);
            OK
        }
        0x01 => {
            let (base, _) = prp(cmd);
            let cqid = (cmd[11] >> 16) as u16;
            if qid == 0 || qid > c.max_ioqpairs || st.sqs.contains_key(&qid) {
                return err(1, 0x01);
            }
            if qsize < 2 || qsize > u32::from(c.mqes) + 1 {
                return err(1, 0x02);
            }
            if cqid == 0 || !st.cqs.contains_key(&cqid) {
                return err(1, 0x00);
            }
            if cmd[11] & 1 == 0 && c.cqr {
                return err(0, 0x02);
            }
            if cpu(s, base, 64).is_none() || base % st.page as u64 != 0 {
                return err(0, 0x13);
            }
            st.sqs.insert(qid, Sq { base, size: qsize, head: 0, cqid });
            reset_doorbell(s, qid, false);
            OK
        }
        0x00 => {
            if qid == 0 || st.sqs.remove(&qid).is_none() {
                return err(1, 0x01);
            }
            OK
        }
        0x04 => {
            if qid == 0 || !st.cqs.contains_key(&qid) {
                return err(1, 0x01);
            }
            if st.sqs.values().any(|q| q.cqid == qid) {
                return err(1, 0x0c);
            }
            st.cqs.remove(&qid);
            OK
        }
        0x02 => {
            let lid = cmd[10] as u8;
            let numd = ((cmd[10] >> 16) | ((cmd[11] & 0xffff) << 16)) as usize + 1;
            let offset = u64::from(cmd[12]) | (u64::from(cmd[13]) << 32);
            if !matches!(lid, 1..=3) {
                return err(1, 0x09);
            }
            let mut log = vec![0u8; 4096];
            if lid == 2 {
                // SMART: composite temperature 300 K, available spare 100%.
                log[1..3].copy_from_slice(&300u16.to_le_bytes());
                log[3] = 100;
            }
            let len = numd * 4;
            let start = (offset as usize).min(log.len());
            let mut out = vec![0u8; len];
            let n = (log.len() - start).min(len);
            out[..n].copy_from_slice(&log[start..start + n]);
            to_host(s, st.page, cmd, &out)
        }
        // Abort: every command completes as soon as it is fetched, so nothing is ever aborted.
        0x08 => Outcome { dw0: 1, ..OK },
        _ => err(0, 0x01),
    }
}

fn pad(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let b = s.as_bytes();
    let n = b.len().min(dst.len());
    dst[..n].copy_from_slice(&b[..n]);
}

fn io_cmd(s: &Shared, st: &mut State, cmd: &[u32; 16]) -> Outcome {
    let c = &s.cfg;
    let opcode = cmd[0] as u8;
    if cmd[1] != 1 {
        return err(0, 0x0b);
    }
    match opcode {
        0x00 => OK,
        0x01 | 0x02 | 0x08 => {
            let slba = u64::from(cmd[10]) | (u64::from(cmd[11]) << 32);
            let nlb = u64::from(cmd[12] & 0xffff) + 1;
            if slba.checked_add(nlb).is_none_or(|e| e > c.n_blocks) {
                return err(0, 0x80);
            }
            let bytes = (nlb << c.lba_shift) as usize;
            let min_page = 1usize << (12 + c.mpsmin);
            if opcode != 0x08 && c.mdts != 0 && bytes > (min_page << c.mdts) {
                return err(0, 0x02);
            }
            let start = (slba << c.lba_shift) as usize;
            let (p1, p2) = prp(cmd);
            match opcode {
                0x02 => {
                    let data = s.storage.lock().unwrap_or_else(|p| p.into_inner())[start..start + bytes].to_vec();
                    to_host(s, st.page, cmd, &data)
                }
                0x01 => match segments(s, st.page, p1, p2, bytes).and_then(|v| translate_all(s, v)) {
                    Ok(segs) => {
                        let mut buf = vec![0u8; bytes];
                        let mut off = 0;
                        for (a, n) in segs {
                            mem::read(a, &mut buf[off..off + n]);
                            off += n;
                        }
                        s.storage.lock().unwrap_or_else(|p| p.into_inner())[start..start + bytes].copy_from_slice(&buf);
                        OK
                    }
                    Err(o) => o,
                },
                _ => {
                    s.storage.lock().unwrap_or_else(|p| p.into_inner())[start..start + bytes].fill(0);
                    OK
                }
            }
        }
        _ => err(0, 0x01),
    }
}
