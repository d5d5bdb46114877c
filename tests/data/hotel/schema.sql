CREATE TABLE today ( -- the simulated date, read by the triggers
  id INTEGER PRIMARY KEY CHECK (id = 1),
  date TEXT NOT NULL
);

CREATE TABLE guest ( -- registered hotel guests
  guest_id TEXT PRIMARY KEY NOT NULL, -- e.g. G-017
  name TEXT NOT NULL,
  email TEXT NOT NULL,
  phone TEXT,
  loyalty_level TEXT NOT NULL DEFAULT 'standard' CHECK (loyalty_level IN ('standard', 'silver', 'gold')),
  points INTEGER NOT NULL DEFAULT 0 CHECK (points >= 0) -- loyalty points balance
);

CREATE TABLE room ( -- the hotel's rooms
  room_no TEXT PRIMARY KEY NOT NULL, -- e.g. 203
  room_type TEXT NOT NULL CHECK (room_type IN ('single', 'double', 'twin', 'family', 'suite')),
  capacity INTEGER NOT NULL CHECK (capacity >= 1), -- most guests the room sleeps
  nightly_rate REAL NOT NULL CHECK (nightly_rate > 0), -- price per night in EUR
  status TEXT NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'maintenance'))
);

CREATE TABLE booking ( -- room bookings (stays from check_in to check_out)
  booking_id TEXT PRIMARY KEY NOT NULL, -- e.g. BK-2041
  guest_id TEXT NOT NULL REFERENCES guest(guest_id),
  room_no TEXT NOT NULL REFERENCES room(room_no),
  check_in DATE NOT NULL CHECK (date(check_in) IS check_in), -- arrival date YYYY-MM-DD
  check_out DATE NOT NULL CHECK (date(check_out) IS check_out), -- departure date YYYY-MM-DD
  num_guests INTEGER NOT NULL CHECK (num_guests >= 1), -- number of people staying
  status TEXT NOT NULL DEFAULT 'booked' CHECK (status IN ('booked', 'checked_in', 'checked_out', 'cancelled')),
  booked_on DATE -- date the booking was made (set by the hotel system)
);

CREATE TABLE booking_extra ( -- add-ons ordered on a booking
  extra_id INTEGER PRIMARY KEY,
  booking_id TEXT NOT NULL REFERENCES booking(booking_id),
  kind TEXT NOT NULL CHECK (kind IN ('breakfast', 'parking', 'airport_transfer')),
  quantity INTEGER NOT NULL DEFAULT 1 CHECK (quantity >= 1), -- persons for breakfast/transfer, spaces for parking
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled'))
);

CREATE TABLE points_redemption ( -- loyalty points redeemed against a booking
  redemption_id INTEGER PRIMARY KEY,
  booking_id TEXT NOT NULL REFERENCES booking(booking_id),
  points INTEGER NOT NULL CHECK (points > 0), -- points taken from the guest's balance
  note TEXT
);

-- Bookings: preconditions of a new booking

CREATE TRIGGER booking_new_rules
BEFORE INSERT ON booking
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_booking_booked: new bookings are created with status booked')
  WHERE NEW.status IS NOT 'booked';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: arrival_not_past: the check-in date cannot be before today')
  WHERE NEW.check_in < (SELECT date FROM today);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: stay_length: a stay is at least 1 and at most 14 nights')
  WHERE julianday(NEW.check_out) - julianday(NEW.check_in) NOT BETWEEN 1 AND 14;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: room_in_service: rooms under maintenance cannot be booked')
  WHERE (SELECT status FROM room WHERE room_no = NEW.room_no) = 'maintenance';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: room_capacity: the number of guests cannot exceed the room capacity')
  WHERE NEW.num_guests > (SELECT capacity FROM room WHERE room_no = NEW.room_no);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_double_booking: the room already has an active booking overlapping these dates')
  WHERE EXISTS (SELECT 1 FROM booking b
                WHERE b.room_no = NEW.room_no
                  AND b.status IN ('booked', 'checked_in')
                  AND b.check_in < NEW.check_out
                  AND NEW.check_in < b.check_out);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: active_booking_cap: a guest can hold at most 3 active bookings')
  WHERE (SELECT COUNT(*) FROM booking
         WHERE guest_id = NEW.guest_id AND status IN ('booked', 'checked_in')) >= 3;
END;

CREATE TRIGGER booking_after_new
AFTER INSERT ON booking
BEGIN
  -- the booking date is set to today
  UPDATE booking SET booked_on = (SELECT date FROM today) WHERE booking_id = NEW.booking_id;
END;

-- Bookings: changes

CREATE TRIGGER booking_closed_final
BEFORE UPDATE ON booking
WHEN OLD.status IN ('checked_out', 'cancelled')
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: closed_is_final: checked-out and cancelled bookings cannot be changed');
END;

CREATE TRIGGER booking_guest_fixed
BEFORE UPDATE OF guest_id ON booking
WHEN NEW.guest_id IS NOT OLD.guest_id
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: booking_guest_fixed: a booking cannot be transferred to another guest');
END;

CREATE TRIGGER booking_stay_change
BEFORE UPDATE OF room_no, check_in, check_out, num_guests ON booking
WHEN NEW.room_no IS NOT OLD.room_no OR NEW.check_in IS NOT OLD.check_in
  OR NEW.check_out IS NOT OLD.check_out OR NEW.num_guests IS NOT OLD.num_guests
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: arrival_not_past: the check-in date cannot be before today')
  WHERE NEW.check_in IS NOT OLD.check_in AND NEW.check_in < (SELECT date FROM today);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: stay_length: a stay is at least 1 and at most 14 nights')
  WHERE julianday(NEW.check_out) - julianday(NEW.check_in) < 1
     OR julianday(NEW.check_out) - julianday(NEW.check_in) > 14;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: room_in_service: no booking can be moved into a room under maintenance')
  WHERE NEW.room_no IS NOT OLD.room_no
    AND EXISTS (SELECT 1 FROM room r WHERE r.room_no = NEW.room_no AND r.status = 'maintenance');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: room_capacity: the number of guests cannot exceed the room capacity')
  WHERE NEW.num_guests > (SELECT r.capacity FROM room r WHERE r.room_no = NEW.room_no);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_double_booking: the room already has an active booking overlapping these dates')
  WHERE NEW.status IN ('booked', 'checked_in')
    AND EXISTS (SELECT 1 FROM booking b
                WHERE b.room_no = NEW.room_no
                  AND b.booking_id <> NEW.booking_id
                  AND b.status IN ('booked', 'checked_in')
                  AND b.check_in < NEW.check_out
                  AND NEW.check_in < b.check_out);
END;

CREATE TRIGGER booking_status_change
BEFORE UPDATE OF status ON booking
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: status_flow: a booking goes booked -> checked_in or cancelled, and checked_in -> checked_out')
  WHERE NOT ((OLD.status = 'booked' AND NEW.status IN ('checked_in', 'cancelled'))
          OR (OLD.status = 'checked_in' AND NEW.status = 'checked_out'));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancel_notice: a booking can be cancelled only at least 2 days before check-in')
  WHERE NEW.status = 'cancelled'
    AND julianday(OLD.check_in) - julianday((SELECT date FROM today)) < 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: check_in_window: a guest can be checked in only from the check-in date until before the check-out date')
  WHERE NEW.status = 'checked_in'
    AND NOT ((SELECT date FROM today) >= NEW.check_in AND (SELECT date FROM today) < NEW.check_out);
END;

CREATE TRIGGER booking_after_cancel
AFTER UPDATE OF status ON booking
WHEN NEW.status = 'cancelled' AND OLD.status = 'booked'
BEGIN
  -- the booking's extras are cancelled and the points redeemed on it go back to the guest
  UPDATE booking_extra SET status = 'cancelled' WHERE booking_id = NEW.booking_id AND status = 'active';
  UPDATE guest SET points = points + (SELECT COALESCE(SUM(points), 0) FROM points_redemption
                                      WHERE booking_id = NEW.booking_id)
  WHERE guest_id = NEW.guest_id;
END;

CREATE TRIGGER booking_after_checkout
AFTER UPDATE OF status ON booking
WHEN NEW.status = 'checked_out' AND OLD.status = 'checked_in'
BEGIN
  -- the guest earns 10 loyalty points per night of the stay
  UPDATE guest
  SET points = points + 10 * CAST(julianday(NEW.check_out) - julianday(NEW.check_in) AS INTEGER)
  WHERE guest_id = NEW.guest_id;
END;

-- Extras

CREATE TRIGGER extra_new_rules
BEFORE INSERT ON booking_extra
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extras_open_booking: extras can only be added to booked or checked-in bookings')
  WHERE NOT EXISTS (SELECT 1 FROM booking
                    WHERE booking_id = NEW.booking_id AND status IN ('booked', 'checked_in'));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extra_quantity: breakfast and airport transfer for at most the number of guests, parking at most 1 space')
  WHERE NEW.quantity > CASE NEW.kind
                         WHEN 'parking' THEN 1
                         ELSE (SELECT num_guests FROM booking WHERE booking_id = NEW.booking_id)
                       END;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extras_per_level: at most 1 active extra per booking for standard guests, 2 for silver, 3 for gold')
  WHERE NEW.status = 'active'
    AND (SELECT COUNT(*) FROM booking_extra e
         WHERE e.booking_id = NEW.booking_id AND e.status = 'active')
        >= (SELECT CASE g.loyalty_level WHEN 'gold' THEN 3 WHEN 'silver' THEN 2 ELSE 1 END
            FROM booking b JOIN guest g ON g.guest_id = b.guest_id
            WHERE b.booking_id = NEW.booking_id);
END;

CREATE TRIGGER extra_change_rules
BEFORE UPDATE ON booking_extra
WHEN NOT (OLD.status = 'active' AND NEW.status = 'cancelled'
          AND NEW.booking_id IS OLD.booking_id AND NEW.kind IS OLD.kind
          AND NEW.quantity IS OLD.quantity)
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extra_cancel_only: an extra can only be cancelled, and cancelled extras stay cancelled');
END;

-- Loyalty points

CREATE TRIGGER redemption_rules
BEFORE INSERT ON points_redemption
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: points_balance: the guest''s points balance must cover the redemption')
  WHERE NEW.points > (SELECT g.points FROM guest g JOIN booking b ON b.guest_id = g.guest_id
                      WHERE b.booking_id = NEW.booking_id);
END;

CREATE TRIGGER redemption_after
AFTER INSERT ON points_redemption
BEGIN
  -- the redeemed points are deducted from the guest's balance
  UPDATE guest SET points = points - NEW.points
  WHERE guest_id = (SELECT guest_id FROM booking WHERE booking_id = NEW.booking_id);
END;
