//! Tests of cuMemAlloc's regions (region.rs).

#[test]
fn freeing_a_suballocation_releases_only_pages_no_live_allocation_uses() {
    use super::config::GPU_PAGE;
    use super::region::released_pages;
    use std::collections::BTreeMap;
    const P: u64 = GPU_PAGE;
    // Live neighbours share the freed slot's first and last page: nothing is released.
    let live: BTreeMap<u64, u64> = [(0, 0x100), (P + 0x300, 0x100)].into();
    assert_eq!(released_pages(&live, 0x100, P + 0x200), None);
    // The same slot with the neighbours gone: both pages go.
    assert_eq!(released_pages(&BTreeMap::new(), 0x100, P + 0x200), Some((0, 2 * P)));
    // A slot over several pages keeps only the shared edge pages.
    let neighbours: BTreeMap<u64, u64> = [(0, 0x100), (4 * P + 0x100, 0x100)].into();
    assert_eq!(released_pages(&neighbours, 0x100, 4 * P), Some((P, 3 * P)), "first page shared, last page free");
    let tail: BTreeMap<u64, u64> = [(4 * P, 0x100)].into();
    assert_eq!(released_pages(&tail, 0, 4 * P + 0x100 - 0x100), Some((0, 4 * P)), "ends on a page boundary");
    let last: BTreeMap<u64, u64> = [(3 * P + 0x80, 0x100)].into();
    assert_eq!(released_pages(&last, 0, 3 * P + 0x80), Some((0, 3 * P)), "last page shared");
    // The last allocation of a page releases it.
    let other: BTreeMap<u64, u64> = [(2 * P, 0x100)].into();
    assert_eq!(released_pages(&other, 0x200, 0x100), Some((0, P)));
}
