package store

import "strconv"

// FailureDomain names the part of the store whose failures model's calls
// share, for the router's back-off windows; model "" names the global
// keys (the registry, the epoch, the ingestors' leases). One server, or
// Sentinel's one primary, is one domain: when it fails every call fails.
// Under Cluster a model's keys all hash to its tag's slot, so a model's
// domain is that slot (a slot lives on one primary at a time), and the
// global keys are one domain apart from them. Slots bound the domains:
// request ids or model names a client makes up cannot grow them.
func (s *Store) FailureDomain(model string) string {
	switch {
	case !s.cluster:
		return "redis"
	case model == "":
		return "global"
	}
	return "slot " + strconv.Itoa(keySlot(prefix(model)))
}

// RequestModel is the package's RequestModel: the router finds a progress
// report's model (so its back-off window) from the request id.
func (s *Store) RequestModel(id string) (string, bool) { return RequestModel(id) }

// keySlot is Redis Cluster's slot of key: CRC16 (XMODEM) of its hash tag
// (the part between the first '{' and the next '}', when not empty) or of
// the whole key, modulo 16384, as the cluster specification defines it.
func keySlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return int(crc16(key) & 16383)
			}
		}
		break
	}
	return int(crc16(key) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), bit by bit:
// it runs once per back-off check of a cluster store, on a short tag.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
