CREATE TABLE clock ( -- the library's day counter, read by the triggers
  id INTEGER PRIMARY KEY CHECK (id = 1),
  today_day INTEGER NOT NULL -- number of the current day
);

CREATE TABLE members ( -- people holding a library card
  member_id TEXT PRIMARY KEY NOT NULL, -- card id, e.g. m_ana
  full_name TEXT NOT NULL,
  is_student INTEGER NOT NULL DEFAULT 0 CHECK (is_student IN (0, 1)), -- 1 for a student card
  max_loans INTEGER NOT NULL DEFAULT 2 -- how many books the member may have out at once
);

CREATE TABLE books (
  book_id TEXT PRIMARY KEY NOT NULL,
  title TEXT NOT NULL,
  shelf_copies INTEGER NOT NULL CHECK (shelf_copies >= 0),
  is_reference INTEGER NOT NULL DEFAULT 0 CHECK (is_reference IN (0, 1)),
  shelf_state TEXT NOT NULL DEFAULT 'on_shelf' CHECK (shelf_state IN ('on_shelf', 'on_loan', 'in_repair'))
);

CREATE TABLE loans ( -- books lent to members
  loan_id INTEGER PRIMARY KEY,
  member_id TEXT NOT NULL REFERENCES members(member_id),
  book_id TEXT NOT NULL REFERENCES books(book_id),
  due_day INTEGER NOT NULL,
  returned_day INTEGER,
  renew_count INTEGER NOT NULL DEFAULT 0 -- times the loan was extended
);

CREATE TABLE reservations ( -- holds placed on books that are out
  reservation_id INTEGER PRIMARY KEY,
  member_id TEXT NOT NULL REFERENCES members(member_id),
  book_id TEXT NOT NULL REFERENCES books(book_id),
  pickup_by_day INTEGER NOT NULL, -- last day to collect the book
  hold_status TEXT NOT NULL DEFAULT 'waiting' CHECK (hold_status IN ('waiting', 'ready', 'collected', 'cancelled'))
);

CREATE TRIGGER loans_new
BEFORE INSERT ON loans
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: loan_limit: the member already has as many books out as their card allows')
  WHERE (SELECT COUNT(*) FROM loans WHERE member_id = NEW.member_id AND returned_day IS NULL)
        >= (SELECT max_loans FROM members WHERE member_id = NEW.member_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: copy_on_shelf: no copy of the book is on the shelf')
  WHERE (SELECT shelf_copies FROM books WHERE book_id = NEW.book_id) < 1;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_reference_loans: reference books stay in the library')
  WHERE (SELECT is_reference FROM books WHERE book_id = NEW.book_id) = 1;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: loan_period: a book is lent for 1 to 21 days (28 on a student card)')
  WHERE NEW.due_day <= (SELECT today_day FROM clock)
     OR NEW.due_day - (SELECT today_day FROM clock)
        > (CASE (SELECT is_student FROM members WHERE member_id = NEW.member_id) WHEN 1 THEN 28 ELSE 21 END);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_loan_open: a new loan starts unreturned and unrenewed')
  WHERE NEW.returned_day IS NOT NULL OR NEW.renew_count <> 0;
END;

CREATE TRIGGER loans_after_new
AFTER INSERT ON loans
BEGIN
  -- one copy leaves the shelf
  UPDATE books SET shelf_copies = shelf_copies - 1 WHERE book_id = NEW.book_id;
  -- a waiting or ready hold of the same member on that book is collected
  UPDATE reservations SET hold_status = 'collected'
  WHERE member_id = NEW.member_id AND book_id = NEW.book_id AND hold_status IN ('waiting', 'ready');
END;

CREATE TRIGGER loans_change
BEFORE UPDATE ON loans
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: returned_final: a returned loan cannot change')
  WHERE OLD.returned_day IS NOT NULL;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: loan_fixed: the member and the book of a loan never change')
  WHERE NEW.member_id IS NOT OLD.member_id OR NEW.book_id IS NOT OLD.book_id;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: renewal_limit: a loan can be renewed at most twice, by 7 to 14 days each time')
  WHERE NEW.renew_count > 2 OR NEW.renew_count < OLD.renew_count
     OR (NEW.due_day IS NOT OLD.due_day AND (NEW.renew_count <> OLD.renew_count + 1
         OR NEW.due_day - OLD.due_day < 7 OR NEW.due_day - OLD.due_day > 14));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: renew_needs_new_due_day: a renewal moves the due day')
  WHERE NEW.renew_count IS NOT OLD.renew_count AND NEW.due_day IS OLD.due_day;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: return_today: a book is returned on the current day')
  WHERE NEW.returned_day IS NOT NULL AND NEW.returned_day IS NOT (SELECT today_day FROM clock);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_renewal_when_reserved: a loan cannot be renewed while someone waits for the book')
  WHERE NEW.renew_count > OLD.renew_count
    AND EXISTS (SELECT 1 FROM reservations r WHERE r.book_id = OLD.book_id AND r.hold_status = 'waiting');
END;

CREATE TRIGGER loans_after_return
AFTER UPDATE OF returned_day ON loans
WHEN OLD.returned_day IS NULL AND NEW.returned_day IS NOT NULL
BEGIN
  -- the copy goes back on the shelf; the oldest waiting hold on the book becomes ready
  UPDATE books SET shelf_copies = shelf_copies + 1 WHERE book_id = NEW.book_id;
  UPDATE reservations SET hold_status = 'ready'
  WHERE reservation_id = (SELECT MIN(reservation_id) FROM reservations
                          WHERE book_id = NEW.book_id AND hold_status = 'waiting');
END;

CREATE TRIGGER reservations_new
BEFORE INSERT ON reservations
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: hold_limit: a member can have at most 2 waiting holds')
  WHERE (SELECT COUNT(*) FROM reservations WHERE member_id = NEW.member_id AND hold_status = 'waiting') >= 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: hold_only_when_out: a book with a copy on the shelf cannot be reserved')
  WHERE (SELECT shelf_copies FROM books WHERE book_id = NEW.book_id) > 0;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_hold_on_own_loan: a member cannot reserve a book they have out')
  WHERE EXISTS (SELECT 1 FROM loans WHERE member_id = NEW.member_id AND book_id = NEW.book_id AND returned_day IS NULL);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_hold_waiting: a new hold is waiting, with a pickup day 3 to 10 days ahead')
  WHERE NEW.hold_status IS NOT 'waiting'
     OR NEW.pickup_by_day - (SELECT today_day FROM clock) NOT BETWEEN 3 AND 10;
END;

CREATE TRIGGER reservations_change
BEFORE UPDATE ON reservations
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: hold_closed: a collected or cancelled hold cannot change')
  WHERE OLD.hold_status IN ('collected', 'cancelled');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: hold_cancel_only: a member can only cancel a hold; the desk marks holds ready or collected')
  WHERE NEW.hold_status IS NOT OLD.hold_status AND NEW.hold_status <> 'cancelled';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: loan_fixed: the member and the book of a hold never change')
  WHERE NEW.member_id IS NOT OLD.member_id OR NEW.book_id IS NOT OLD.book_id;
END;
