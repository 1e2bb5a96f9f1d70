//! Lock helpers that survive a panicking holder: every structure behind these locks is
//! consistent between statements, so a poisoned lock is used as it is rather than spreading
//! the panic to every thread.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Read-locks `m`, poisoned or not.
pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    match m.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Write-locks `m`, poisoned or not.
pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    match m.write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
