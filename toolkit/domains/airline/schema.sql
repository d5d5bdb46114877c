-- Airline domain: tables (static constraints) then triggers (the compiled policy).
-- Comments on a CREATE TABLE line document the table; trailing comments document columns.

CREATE TABLE clock ( -- the simulated current date read by the triggers
  clock_id INTEGER PRIMARY KEY CHECK (clock_id = 1),
  today TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE customer ( -- airline customers
  user_id TEXT PRIMARY KEY NOT NULL, -- e.g. mia_li_3668
  first_name TEXT NOT NULL,
  last_name TEXT NOT NULL,
  email TEXT NOT NULL UNIQUE,
  membership TEXT NOT NULL CHECK (membership IN ('regular', 'silver', 'gold')),
  date_of_birth TEXT -- YYYY-MM-DD
);

CREATE TABLE payment_method ( -- payment methods saved in a customer profile
  payment_id TEXT PRIMARY KEY NOT NULL, -- e.g. credit_card_4421, gift_card_7791, certificate_3302
  user_id TEXT NOT NULL REFERENCES customer(user_id),
  kind TEXT NOT NULL CHECK (kind IN ('credit_card', 'gift_card', 'certificate')),
  label TEXT NOT NULL, -- e.g. Visa ending 4421
  balance REAL CHECK (balance IS NULL OR balance >= 0), -- USD left on gift cards and certificates; null for credit cards
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'removed'))
);

CREATE TABLE flight ( -- scheduled flights, one row per flight number and date
  flight_id TEXT PRIMARY KEY NOT NULL, -- flight number and date, e.g. HAT170-2024-05-20
  flight_number TEXT NOT NULL,
  date TEXT NOT NULL, -- YYYY-MM-DD
  origin TEXT NOT NULL, -- IATA airport code
  destination TEXT NOT NULL, -- IATA airport code
  departure_time TEXT NOT NULL, -- local time HH:MM
  status TEXT NOT NULL CHECK (status IN ('available', 'delayed', 'cancelled', 'flying', 'landed'))
);

CREATE TABLE flight_cabin ( -- price and seats left per flight and cabin
  flight_id TEXT NOT NULL REFERENCES flight(flight_id),
  cabin TEXT NOT NULL CHECK (cabin IN ('basic_economy', 'economy', 'business')),
  price REAL NOT NULL CHECK (price > 0), -- USD per passenger
  seats_available INTEGER NOT NULL CHECK (seats_available >= 0),
  PRIMARY KEY (flight_id, cabin)
);

CREATE TABLE reservation ( -- one-way reservations
  reservation_id INTEGER PRIMARY KEY,
  user_id TEXT NOT NULL REFERENCES customer(user_id),
  flight_id TEXT NOT NULL REFERENCES flight(flight_id),
  cabin TEXT NOT NULL CHECK (cabin IN ('basic_economy', 'economy', 'business')),
  passenger_count INTEGER NOT NULL,
  insurance TEXT NOT NULL DEFAULT 'no' CHECK (insurance IN ('yes', 'no')), -- travel insurance, 30 USD per passenger
  total_bags INTEGER NOT NULL DEFAULT 0 CHECK (total_bags >= 0), -- checked bags for all passengers
  nonfree_bags INTEGER NOT NULL DEFAULT 0, -- bags beyond the free allowance (50 USD each)
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled')),
  created_on TEXT -- booking date YYYY-MM-DD
);

CREATE TABLE payment ( -- charges and refunds of reservations
  payment_tx_id INTEGER PRIMARY KEY,
  reservation_id INTEGER NOT NULL REFERENCES reservation(reservation_id),
  payment_id TEXT NOT NULL REFERENCES payment_method(payment_id),
  kind TEXT NOT NULL DEFAULT 'charge' CHECK (kind IN ('charge', 'refund')),
  purpose TEXT NOT NULL CHECK (purpose IN ('booking', 'baggage', 'cabin_change')),
  amount REAL NOT NULL CHECK (amount > 0) -- USD
);

CREATE TABLE audit_log ( -- append-only journal written by the triggers
  log_id INTEGER PRIMARY KEY,
  entity TEXT NOT NULL,
  entity_id TEXT NOT NULL,
  event TEXT NOT NULL,
  detail TEXT,
  logged_on TEXT
);

-- ============================================================================ reservation: booking

CREATE TRIGGER reservation_insert_rules
BEFORE INSERT ON reservation
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: passenger_limit: a reservation holds between 1 and 5 passengers')
  WHERE NEW.passenger_count < 1 OR NEW.passenger_count > 5;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_reservation_active: new reservations are created with status active')
  WHERE NEW.status IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: flight_bookable: only existing flights with status available can be booked')
  WHERE (SELECT status FROM flight WHERE flight_id = NEW.flight_id) IS NOT 'available';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: seat_availability: the cabin must have at least as many seats left as the reservation has passengers')
  WHERE COALESCE((SELECT seats_available FROM flight_cabin
                  WHERE flight_id = NEW.flight_id AND cabin = NEW.cabin), 0) < NEW.passenger_count;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bag_limit: at most 5 checked bags per passenger')
  WHERE NEW.total_bags > 5 * NEW.passenger_count;
END;

CREATE TRIGGER reservation_after_insert
AFTER INSERT ON reservation
BEGIN
  -- The booked seats are taken from the cabin inventory, created_on is set to today, nonfree_bags is computed from the free allowance, and the booking is logged
  UPDATE flight_cabin SET seats_available = seats_available - NEW.passenger_count
  WHERE flight_id = NEW.flight_id AND cabin = NEW.cabin;
  UPDATE reservation
  SET created_on = (SELECT today FROM clock),
      nonfree_bags = MAX(0, NEW.total_bags - NEW.passenger_count * (
        CASE NEW.cabin WHEN 'basic_economy' THEN 0 WHEN 'economy' THEN 1 ELSE 2 END
        + CASE (SELECT membership FROM customer WHERE user_id = NEW.user_id)
            WHEN 'gold' THEN 2 WHEN 'silver' THEN 1 ELSE 0 END))
  WHERE reservation_id = NEW.reservation_id;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('reservation', NEW.reservation_id, 'booked',
          NEW.flight_id || ' ' || NEW.cabin || ' x' || NEW.passenger_count, (SELECT today FROM clock));
END;

-- ============================================================================ reservation: changes

CREATE TRIGGER reservation_cancelled_final
BEFORE UPDATE ON reservation
WHEN OLD.status = 'cancelled'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancelled_is_final: a cancelled reservation cannot be modified or re-activated');
END;

CREATE TRIGGER reservation_fixed_fields
BEFORE UPDATE OF passenger_count, user_id, insurance ON reservation
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: passenger_count_fixed: the number of passengers of a reservation cannot change; book a new reservation instead')
  WHERE NEW.passenger_count IS NOT OLD.passenger_count;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: owner_fixed: a reservation cannot be transferred to another user')
  WHERE NEW.user_id IS NOT OLD.user_id;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: insurance_at_booking_only: travel insurance can only be chosen when booking')
  WHERE NEW.insurance IS NOT OLD.insurance;
END;

CREATE TRIGGER reservation_cancel_rules
BEFORE UPDATE OF status ON reservation
WHEN NEW.status = 'cancelled' AND OLD.status = 'active'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_cancel_after_departure: a reservation whose flight is flying or has landed cannot be cancelled')
  WHERE (SELECT status FROM flight WHERE flight_id = OLD.flight_id) IN ('flying', 'landed');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancellation_eligibility: cancellation requires a booking made within the last 24 hours, a business cabin, travel insurance, or a flight cancelled by the airline')
  WHERE NOT (julianday((SELECT today FROM clock)) - julianday(OLD.created_on) <= 1
             OR OLD.cabin = 'business'
             OR OLD.insurance = 'yes'
             OR (SELECT status FROM flight WHERE flight_id = OLD.flight_id) = 'cancelled');
END;

CREATE TRIGGER reservation_after_cancel
AFTER UPDATE OF status ON reservation
WHEN NEW.status = 'cancelled' AND OLD.status = 'active'
BEGIN
  -- The seats return to the cabin inventory and every charge of the reservation is refunded to the method it was paid with (gift card and certificate balances are restored)
  UPDATE flight_cabin SET seats_available = seats_available + OLD.passenger_count
  WHERE flight_id = OLD.flight_id AND cabin = OLD.cabin;
  INSERT INTO payment (reservation_id, payment_id, kind, purpose, amount)
  SELECT reservation_id, payment_id, 'refund', purpose, amount FROM payment
  WHERE reservation_id = OLD.reservation_id AND kind = 'charge' ORDER BY payment_tx_id;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('reservation', OLD.reservation_id, 'cancelled', NULL, (SELECT today FROM clock));
END;

CREATE TRIGGER reservation_flight_change_rules
BEFORE UPDATE OF flight_id ON reservation
WHEN NEW.flight_id IS NOT OLD.flight_id
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: basic_economy_no_flight_change: basic economy reservations cannot change flights')
  WHERE OLD.cabin = 'basic_economy';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: same_route: the new flight must have the same origin and destination')
  WHERE NOT EXISTS (SELECT 1 FROM flight a, flight b
                    WHERE a.flight_id = OLD.flight_id AND b.flight_id = NEW.flight_id
                      AND a.origin = b.origin AND a.destination = b.destination);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: flight_bookable: only existing flights with status available can be booked')
  WHERE (SELECT status FROM flight WHERE flight_id = NEW.flight_id) IS NOT 'available';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: seat_availability: the cabin must have at least as many seats left as the reservation has passengers')
  WHERE COALESCE((SELECT seats_available FROM flight_cabin
                  WHERE flight_id = NEW.flight_id AND cabin = NEW.cabin), 0) < OLD.passenger_count;
END;

CREATE TRIGGER reservation_cabin_change_rules
BEFORE UPDATE OF cabin ON reservation
WHEN NEW.cabin IS NOT OLD.cabin AND NEW.flight_id IS OLD.flight_id
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: seat_availability: the cabin must have at least as many seats left as the reservation has passengers')
  WHERE COALESCE((SELECT seats_available FROM flight_cabin
                  WHERE flight_id = NEW.flight_id AND cabin = NEW.cabin), 0) < OLD.passenger_count;
END;

CREATE TRIGGER reservation_after_move
AFTER UPDATE OF flight_id, cabin ON reservation
WHEN NEW.flight_id IS NOT OLD.flight_id OR NEW.cabin IS NOT OLD.cabin
BEGIN
  -- The seats move in the inventory: released on the old flight and cabin, taken on the new ones
  UPDATE flight_cabin SET seats_available = seats_available + OLD.passenger_count
  WHERE flight_id = OLD.flight_id AND cabin = OLD.cabin;
  UPDATE flight_cabin SET seats_available = seats_available - NEW.passenger_count
  WHERE flight_id = NEW.flight_id AND cabin = NEW.cabin;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('reservation', NEW.reservation_id, 'moved',
          OLD.flight_id || ' ' || OLD.cabin || ' -> ' || NEW.flight_id || ' ' || NEW.cabin,
          (SELECT today FROM clock));
END;

CREATE TRIGGER reservation_bag_rules
BEFORE UPDATE OF total_bags ON reservation
WHEN NEW.total_bags IS NOT OLD.total_bags
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bags_only_increase: checked bags can be added but never removed')
  WHERE NEW.total_bags < OLD.total_bags;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bag_limit: at most 5 checked bags per passenger')
  WHERE NEW.total_bags > 5 * OLD.passenger_count;
END;

CREATE TRIGGER reservation_after_bags
AFTER UPDATE OF total_bags, cabin ON reservation
WHEN NEW.total_bags IS NOT OLD.total_bags OR NEW.cabin IS NOT OLD.cabin
BEGIN
  -- nonfree_bags is recomputed from the free allowance of the (new) cabin and the membership tier
  UPDATE reservation
  SET nonfree_bags = MAX(0, NEW.total_bags - NEW.passenger_count * (
        CASE NEW.cabin WHEN 'basic_economy' THEN 0 WHEN 'economy' THEN 1 ELSE 2 END
        + CASE (SELECT membership FROM customer WHERE user_id = NEW.user_id)
            WHEN 'gold' THEN 2 WHEN 'silver' THEN 1 ELSE 0 END))
  WHERE reservation_id = NEW.reservation_id;
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  SELECT 'reservation', NEW.reservation_id, 'bags', OLD.total_bags || ' -> ' || NEW.total_bags,
         (SELECT today FROM clock)
  WHERE NEW.total_bags IS NOT OLD.total_bags;
END;

-- ============================================================================ payments

CREATE TRIGGER payment_charge_rules
BEFORE INSERT ON payment
WHEN NEW.kind = 'charge'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: reservation_active: charges can only be made on active reservations')
  WHERE (SELECT status FROM reservation WHERE reservation_id = NEW.reservation_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: payment_method_owner: the payment method must belong to the owner of the reservation')
  WHERE (SELECT user_id FROM payment_method WHERE payment_id = NEW.payment_id)
        IS NOT (SELECT user_id FROM reservation WHERE reservation_id = NEW.reservation_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: payment_method_active: removed payment methods cannot be charged')
  WHERE (SELECT status FROM payment_method WHERE payment_id = NEW.payment_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: insufficient_balance: a gift card or travel certificate cannot be charged more than its remaining balance')
  WHERE (SELECT kind FROM payment_method WHERE payment_id = NEW.payment_id) IN ('gift_card', 'certificate')
    AND (SELECT balance FROM payment_method WHERE payment_id = NEW.payment_id) < NEW.amount;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_certificate_per_reservation: at most one travel certificate can be used per reservation')
  WHERE (SELECT kind FROM payment_method WHERE payment_id = NEW.payment_id) = 'certificate'
    AND EXISTS (SELECT 1 FROM payment p JOIN payment_method m ON m.payment_id = p.payment_id
                WHERE p.reservation_id = NEW.reservation_id AND p.kind = 'charge'
                  AND m.kind = 'certificate' AND p.payment_id <> NEW.payment_id);
END;

CREATE TRIGGER payment_after_insert
AFTER INSERT ON payment
BEGIN
  -- Gift card and certificate balances go down by a charge and up by a refund; every payment is logged
  UPDATE payment_method
  SET balance = balance + CASE NEW.kind WHEN 'refund' THEN NEW.amount ELSE -NEW.amount END
  WHERE payment_id = NEW.payment_id AND kind IN ('gift_card', 'certificate');
  INSERT INTO audit_log (entity, entity_id, event, detail, logged_on)
  VALUES ('payment', NEW.reservation_id, NEW.kind,
          NEW.purpose || ' ' || NEW.amount || ' via ' || NEW.payment_id, (SELECT today FROM clock));
END;

-- ============================================================================ customers

CREATE TRIGGER customer_update_rules
BEFORE UPDATE ON customer
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: email_format: an email address must contain @ and a dot after it')
  WHERE NEW.email NOT LIKE '%_@_%._%';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: membership_fixed: agents cannot change a membership tier')
  WHERE NEW.membership IS NOT OLD.membership;
END;
