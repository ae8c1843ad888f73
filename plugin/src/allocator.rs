//! The allocator settings the daemon makes at startup, and the one call that gives freed
//! memory back to the system after a large Synchronize.
//!
//! A Status document with 10,000 claims, a Synchronize of a few thousand containers or a
//! checkpoint snapshot read at startup are buffers of megabytes that live for milliseconds. glibc
//! serves allocations over its mmap threshold (128 KiB at first) as their own mappings, which go
//! back to the system when freed, but it raises that threshold to the size of each such buffer
//! freed: later buffers of that size then come from the heap, and the heap keeps their pages.
//! Measured with the daemon bench (docs/performance.md): five Status calls with 10,000 claims
//! left RSS 14 MiB higher with the threshold free to move, 0.3 MiB with it fixed.
//!
//! A Synchronize is the other way round: tens of megabytes of small allocations (a string per
//! field, a map per label set of every container) that are all freed once it is answered. glibc
//! keeps freed heap pages unless they are at the top of the heap, so the pages stay resident,
//! spread over the heap of every thread that decoded or read them (docs/performance.md, "Memory
//! per known container", has the heap profile). [`give_back_free_memory`] returns them.
#![allow(unsafe_code)]

/// The threshold the daemon fixes: glibc's own starting value.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`], so large buffers return to the system
/// when freed. Returns whether the setting took (always `false` off glibc, where nothing is done).
pub fn return_large_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` changes a tunable of glibc's allocator under the allocator's own lock
        // (it is safe to call from any thread at any time); its arguments are plain integers and
        // the value is within the range glibc accepts (0 to 32 MiB on 64-bit).
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Gives the heap pages that hold no live allocation back to the system, in every arena
/// (glibc's `malloc_trim(0)`): after a large Synchronize is freed, the resident memory drops to
/// what the daemon keeps. Returns whether any memory was released (always `false` off glibc,
/// where nothing is done). It walks the free lists of every arena under their locks: a few
/// milliseconds after a Synchronize of 10,000 containers, so call it off the async workers.
pub fn give_back_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes each arena's own lock while it releases pages that hold
        // no allocation (it never touches memory in use), so it is safe from any thread at any
        // time; its argument is a plain integer (0: keep no extra padding at the heap's top).
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_threshold_is_accepted() {
        assert!(super::return_large_buffers());
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_heap_pages_go_back_to_the_system() {
        // Many small allocations below the mmap threshold, then all but the last freed: the
        // last keeps the heap's top in use, so only a trim of free pages inside can return them.
        let blocks: Vec<Vec<u8>> = (0..20_000).map(|i| vec![i as u8; 1_000]).collect();
        let keep = Box::new([1u8; 100]);
        drop(blocks);
        assert!(super::give_back_free_memory());
        assert_eq!(keep[0], 1);
    }
}
