package dataconn

import (
	"runtime"
	"time"
)

// Think waits d: idle (sleeping) or busy (spinning on the CPU, as uperf's
// "busy" think does). It returns ErrInterrupted when cancel closes first.
func Think(d time.Duration, busy bool, cancel <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	if busy {
		end := time.Now().Add(d)
		for i := 0; ; i++ {
			if time.Now().After(end) {
				return nil
			}
			if i%1024 == 0 {
				select {
				case <-cancel:
					return ErrInterrupted
				default:
				}
				runtime.Gosched()
			}
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-cancel:
		return ErrInterrupted
	}
}
