//! Which network interfaces carry the daemon's addresses (where the program is attached).

use std::collections::BTreeSet;
use std::net::IpAddr;

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

use crate::KernelError;

/// The interfaces carrying one of `ips`; an unspecified address stands for every interface
/// that is up.
pub(crate) fn carrying(ips: &[IpAddr]) -> Result<Vec<String>, KernelError> {
    let all: Vec<_> = getifaddrs()
        .map_err(|e| KernelError::Interfaces(e.to_string()))?
        .collect();
    let mut names = BTreeSet::new();
    for ip in ips {
        let mut found = false;
        for ifa in &all {
            let addr = ifa.address.as_ref().and_then(|a| {
                a.as_sockaddr_in()
                    .map(|a| IpAddr::V4(a.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|a| IpAddr::V6(a.ip())))
            });
            let up = ifa.flags.contains(InterfaceFlags::IFF_UP);
            if addr.is_some() && ((ip.is_unspecified() && up) || addr == Some(*ip)) {
                names.insert(ifa.interface_name.clone());
                found = true;
            }
        }
        if !found {
            return Err(KernelError::NoInterface(*ip));
        }
    }
    Ok(names.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_by_its_address_and_an_unknown_address_is_an_error() {
        let lo = carrying(&["127.0.0.1".parse().expect("ip")]).expect("interfaces");
        assert_eq!(lo, vec!["lo".to_string()]);
        let lo6 = carrying(&["::1".parse().expect("ip")]).expect("interfaces");
        assert_eq!(lo6, vec!["lo".to_string()]);
        let none = carrying(&["192.0.2.77".parse().expect("ip")]);
        assert!(matches!(none, Err(KernelError::NoInterface(_))), "{none:?}");
    }
}
